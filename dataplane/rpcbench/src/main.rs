//! `rpcbench`: RPC NULL round trips next to a raw TCP echo. See lib.rs.

use rpcbench::nfs::ReadClient;
use rpcbench::{measure, sample, summarize, EchoClient, EchoServer, NullClient, RoundTrip, Stats, CALLS_MAX, NFS_PROGRAM, NFS_V3};
use std::time::Duration;
use std::net::SocketAddr;
use std::process::ExitCode;

const USAGE: &str = "\
usage: rpcbench null    --addr IP:PORT [--prog N] [--vers N] [--calls N] [--warmup N] [--json]
       rpcbench echo    --addr IP:PORT [--calls N] [--warmup N] [--json]
       rpcbench echo-server --addr IP:PORT
       rpcbench read    --addr IP:PORT --mount-port N --export PATH --file NAME [--count N] [--calls N] [--warmup N] [--json]
       rpcbench storm   --addr IP:PORT [--conns N] [--depth N] [--seconds N] [--prog N] [--vers N] [--json]
       rpcbench compare --addr IP:PORT [--prog N] [--vers N] [--calls N] [--rounds N] [--json]
                        [--mount-port N --export PATH --file NAME [--count N]]

null         RPC NULL calls (procedure 0, AUTH_NONE), one in flight, over TCP
echo         the same byte counts against `rpcbench echo-server`
compare      starts an echo server on 127.0.0.1 in this process and alternates
             echo and NULL rounds (echo, null, echo, null, ...), so both see the
             same machine load; prints both and the p50 ratio. With --export and
             --file it then does the same for NFSv3 READs of --count bytes at
             random aligned offsets of that file (MOUNT3 on --mount-port, LOOKUP)
             against an echo moving exactly the bytes of one READ call and reply
read         those READs alone, one in flight (AUTH_SYS uid 0)
Defaults: --prog 100003 --vers 3 (NFSv3) --calls 20000 --warmup 1000 --rounds 4 --count 4096
";

/// Most alternation rounds `compare` accepts.
const ROUNDS_MAX: u64 = 100;

struct Args {
    cmd: String,
    addr: Option<SocketAddr>,
    prog: u32,
    vers: u32,
    calls: u64,
    warmup: u64,
    rounds: u64,
    json: bool,
    mount_port: Option<u16>,
    export: Option<String>,
    file: Option<String>,
    count: u32,
    /// storm: connections, calls in flight on each, how long.
    conns: usize,
    depth: usize,
    seconds: u64,
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let cmd = argv.first().ok_or("missing command")?.clone();
    let mut a = Args { conns: 1000, depth: 4, seconds: 3, cmd, addr: None, prog: NFS_PROGRAM, vers: NFS_V3, calls: 20_000, warmup: 1000, rounds: 4, json: false, mount_port: None, export: None, file: None, count: 4096 };
    let mut i = 1;
    while i < argv.len() {
        let flag = argv[i].as_str();
        if flag == "--json" {
            a.json = true;
            i += 1;
            continue;
        }
        let val = argv.get(i + 1).ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |max: u64| -> Result<u64, String> {
            let n: u64 = val.parse().map_err(|_| format!("{flag} {val:?} is not a number"))?;
            if n > max {
                return Err(format!("{flag} {n} is larger than {max}"));
            }
            Ok(n)
        };
        match flag {
            "--addr" => a.addr = Some(val.parse().map_err(|_| format!("--addr {val:?} is not IP:PORT"))?),
            "--prog" => a.prog = num(u32::MAX as u64)? as u32,
            "--vers" => a.vers = num(u32::MAX as u64)? as u32,
            "--calls" => a.calls = num(CALLS_MAX)?,
            "--warmup" => a.warmup = num(CALLS_MAX)?,
            "--rounds" => a.rounds = num(ROUNDS_MAX)?,
            "--mount-port" => a.mount_port = Some(num(u16::MAX as u64)? as u16),
            "--export" => a.export = Some(val.clone()),
            "--file" => a.file = Some(val.clone()),
            "--conns" => a.conns = num(rpcbench::storm::STORM_CONNS_MAX as u64)? as usize,
            "--depth" => a.depth = num(rpcbench::storm::STORM_DEPTH_MAX as u64)? as usize,
            "--seconds" => a.seconds = num(3600)?,
            "--count" => a.count = num(rpcbench::nfs::READ_COUNT_MAX as u64)? as u32,
            _ => return Err(format!("unknown argument {flag:?}")),
        }
        i += 2;
    }
    if a.calls == 0 {
        return Err("--calls must be at least 1".into());
    }
    if a.rounds == 0 || a.rounds > a.calls {
        return Err(format!("--rounds must be 1..=calls ({})", a.calls));
    }
    if a.addr.is_none() {
        return Err("--addr IP:PORT is required".into());
    }
    let read_args = [a.mount_port.is_some(), a.export.is_some(), a.file.is_some()];
    if read_args.iter().any(|&x| x) && !read_args.iter().all(|&x| x) {
        return Err("READs need all of --mount-port, --export and --file".into());
    }
    if a.cmd == "read" && a.file.is_none() {
        return Err("read needs --mount-port, --export and --file".into());
    }
    if a.count == 0 {
        return Err("--count must be at least 1".into());
    }
    Ok(a)
}

fn print(label: &str, s: &Stats, json: bool) {
    if json {
        println!("{{\"{label}\":{}}}", s.to_json());
    } else {
        println!(
            "{label:<6} {} calls in {:.2}s: {:.0} calls/s, p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us, mean {:.1} us",
            s.calls, s.elapsed_s, s.calls_per_s, s.rtt_us_p50, s.rtt_us_p99, s.rtt_us_p99_9, s.rtt_us_mean
        );
    }
}

/// Alternate echo and target rounds on one connection each, pooling each
/// side's samples, so a change in machine load hits both alike. Returns
/// (target, echo).
fn alternate(a: &Args, target: &mut dyn RoundTrip, echo: &mut EchoClient) -> std::io::Result<(Stats, Stats)> {
    let per_round = a.calls / a.rounds;
    let mut echo_samples = Vec::with_capacity((per_round * a.rounds) as usize);
    let mut target_samples = Vec::with_capacity((per_round * a.rounds) as usize);
    let (mut echo_t, mut target_t) = (Duration::ZERO, Duration::ZERO);
    for r in 0..a.rounds {
        let warm = if r == 0 { a.warmup } else { 0 };
        let seq = (r as u32) << 24;
        let (s, t) = sample(echo, warm, per_round, seq)?;
        echo_samples.extend(s);
        echo_t += t;
        let (s, t) = sample(target, warm, per_round, seq)?;
        target_samples.extend(s);
        target_t += t;
    }
    Ok((summarize(&mut target_samples, target_t), summarize(&mut echo_samples, echo_t)))
}

fn compare(a: &Args, addr: SocketAddr) -> std::io::Result<(Stats, Stats)> {
    let echo_srv = EchoServer::start("127.0.0.1:0".parse().unwrap())?;
    let mut echo = EchoClient::connect(echo_srv.addr())?;
    let mut null = NullClient::connect(addr, a.prog, a.vers)?;
    alternate(a, &mut null, &mut echo)
}

fn read_client(a: &Args, addr: SocketAddr) -> std::io::Result<ReadClient> {
    let mount = SocketAddr::new(addr.ip(), a.mount_port.expect("checked in parse"));
    ReadClient::connect(addr, mount, a.export.as_deref().unwrap(), a.file.as_deref().unwrap(), a.count)
}

/// READs against an echo of exactly their bytes: one READ first tells the
/// reply's size, then the echo server is started with the call's and the
/// reply's sizes.
fn compare_read(a: &Args, addr: SocketAddr) -> std::io::Result<(Stats, Stats)> {
    let mut read = read_client(a, addr)?;
    read.round_trip(0x7000_0000)?;
    let (call, reply) = (read.call_bytes().to_vec(), read.last_reply_bytes);
    let echo_srv = EchoServer::start_sized("127.0.0.1:0".parse().unwrap(), call.len(), reply)?;
    let mut echo = EchoClient::with_message(echo_srv.addr(), call, reply)?;
    alternate(a, &mut read, &mut echo)
}

fn run(a: Args) -> std::io::Result<()> {
    let addr = a.addr.expect("checked in parse");
    match a.cmd.as_str() {
        "null" => {
            let mut c = NullClient::connect(addr, a.prog, a.vers)?;
            print("null", &measure(&mut c, a.warmup, a.calls, 1)?, a.json);
        }
        "echo" => {
            let mut c = EchoClient::connect(addr)?;
            print("echo", &measure(&mut c, a.warmup, a.calls, 1)?, a.json);
        }
        "read" => {
            let mut c = read_client(&a, addr)?;
            print("read", &measure(&mut c, a.warmup, a.calls, 1)?, a.json);
        }
        "storm" => {
            let cfg = rpcbench::storm::StormConfig {
                addr,
                conns: a.conns,
                depth: a.depth,
                duration: Duration::from_secs(a.seconds),
                prog: a.prog,
                vers: a.vers,
            };
            let r = rpcbench::storm::storm(&cfg)?;
            if a.json {
                println!("{}", r.to_json());
            } else {
                println!(
                    "storm  {} connections served, {} refused, {} calls; good client {} calls: p50 {:.0} us, p99 {:.0} us, max {:.0} us",
                    r.served, r.refused, r.calls, r.good_calls, r.good_us_p50, r.good_us_p99, r.good_us_max
                );
            }
        }
        "echo-server" => {
            let s = EchoServer::start(addr)?;
            eprintln!("rpcbench: echo server on {}", s.addr());
            loop {
                std::thread::park();
            }
        }
        "compare" => {
            let (null, echo) = compare(&a, addr)?;
            let read = if a.file.is_some() { Some(compare_read(&a, addr)?) } else { None };
            if a.json {
                let read_json = match &read {
                    Some((r, e)) => format!(
                        ",\"read\":{{\"count\":{},\"stats\":{},\"echo\":{},\"read_over_echo_p50\":{:.3}}}",
                        a.count,
                        r.to_json(),
                        e.to_json(),
                        r.rtt_us_p50 / e.rtt_us_p50
                    ),
                    None => String::new(),
                };
                println!(
                    "{{\"target\":{{\"addr\":\"{addr}\",\"prog\":{},\"vers\":{},\"stats\":{}}},\"echo\":{},\"null_over_echo_p50\":{:.3}{read_json}}}",
                    a.prog,
                    a.vers,
                    null.to_json(),
                    echo.to_json(),
                    null.rtt_us_p50 / echo.rtt_us_p50
                );
            } else {
                print("null", &null, false);
                print("echo", &echo, false);
                println!("NULL/echo p50 ratio {:.2}", null.rtt_us_p50 / echo.rtt_us_p50);
                if let Some((r, e)) = &read {
                    print("read", r, false);
                    print("echo", e, false);
                    println!("READ {} B/echo of the same bytes p50 ratio {:.2}", a.count, r.rtt_us_p50 / e.rtt_us_p50);
                }
            }
        }
        other => {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("unknown command {other:?}")))
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(|s| s == "--help" || s == "-h").unwrap_or(true) {
        print!("{USAGE}");
        return if argv.is_empty() { ExitCode::from(2) } else { ExitCode::SUCCESS };
    }
    let a = match parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rpcbench: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rpcbench: {e}");
            ExitCode::from(1)
        }
    }
}
