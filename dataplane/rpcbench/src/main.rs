//! `rpcbench`: RPC NULL round trips next to a raw TCP echo. See lib.rs.

use rpcbench::{measure, sample, summarize, EchoClient, EchoServer, NullClient, Stats, CALLS_MAX, NFS_PROGRAM, NFS_V3};
use std::time::Duration;
use std::net::SocketAddr;
use std::process::ExitCode;

const USAGE: &str = "\
usage: rpcbench null    --addr IP:PORT [--prog N] [--vers N] [--calls N] [--warmup N] [--json]
       rpcbench echo    --addr IP:PORT [--calls N] [--warmup N] [--json]
       rpcbench echo-server --addr IP:PORT
       rpcbench compare --addr IP:PORT [--prog N] [--vers N] [--calls N] [--rounds N] [--json]

null         RPC NULL calls (procedure 0, AUTH_NONE), one in flight, over TCP
echo         the same byte counts against `rpcbench echo-server`
compare      starts an echo server on 127.0.0.1 in this process and alternates
             echo and NULL rounds (echo, null, echo, null, ...), so both see the
             same machine load; prints both and the p50 ratio
Defaults: --prog 100003 --vers 3 (NFSv3) --calls 20000 --warmup 1000 --rounds 4
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
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let cmd = argv.first().ok_or("missing command")?.clone();
    let mut a = Args { cmd, addr: None, prog: NFS_PROGRAM, vers: NFS_V3, calls: 20_000, warmup: 1000, rounds: 4, json: false };
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

/// Alternate echo and NULL rounds on one connection each, pooling each
/// side's samples, so a change in machine load hits both alike.
fn compare(a: &Args, addr: SocketAddr) -> std::io::Result<(Stats, Stats)> {
    let echo_srv = EchoServer::start("127.0.0.1:0".parse().unwrap())?;
    let mut echo = EchoClient::connect(echo_srv.addr())?;
    let mut null = NullClient::connect(addr, a.prog, a.vers)?;
    let per_round = a.calls / a.rounds;
    let mut echo_samples = Vec::with_capacity((per_round * a.rounds) as usize);
    let mut null_samples = Vec::with_capacity((per_round * a.rounds) as usize);
    let (mut echo_t, mut null_t) = (Duration::ZERO, Duration::ZERO);
    for r in 0..a.rounds {
        let warm = if r == 0 { a.warmup } else { 0 };
        let seq = (r as u32) << 24;
        let (s, t) = sample(&mut echo, warm, per_round, seq)?;
        echo_samples.extend(s);
        echo_t += t;
        let (s, t) = sample(&mut null, warm, per_round, seq)?;
        null_samples.extend(s);
        null_t += t;
    }
    Ok((summarize(&mut null_samples, null_t), summarize(&mut echo_samples, echo_t)))
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
        "echo-server" => {
            let s = EchoServer::start(addr)?;
            eprintln!("rpcbench: echo server on {}", s.addr());
            loop {
                std::thread::park();
            }
        }
        "compare" => {
            let (null, echo) = compare(&a, addr)?;
            if a.json {
                println!(
                    "{{\"target\":{{\"addr\":\"{addr}\",\"prog\":{},\"vers\":{},\"stats\":{}}},\"echo\":{},\"null_over_echo_p50\":{:.3}}}",
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
