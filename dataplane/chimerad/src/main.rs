//! `chimerad`: the Chimera server binary. Roles (MDS, DS, both) come from
//! the config file; see CONFIG.md.

use chimerad::config::Config;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
usage: chimerad --config FILE            run the server
       chimerad --check-config --config FILE
                                         validate FILE, print OK or the error
       chimerad --version | --help

Environment: CHIMERA_LOG=error|warn|info|debug|trace overrides common.log_level.
";

enum Mode {
    Run,
    Check,
}

fn parse_args(args: &[String]) -> Result<Option<(Mode, PathBuf)>, String> {
    let mut mode = Mode::Run;
    let mut config = None;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--help" | "-h" => return Ok(None),
            "--version" | "-v" => {
                println!("chimerad {}", env!("CARGO_PKG_VERSION"));
                std::process::exit(0);
            }
            "--check-config" => mode = Mode::Check,
            "--config" | "-c" => {
                i += 1;
                let f = args.get(i).ok_or("--config needs a file argument")?;
                config = Some(PathBuf::from(f));
            }
            a if a.starts_with("--config=") => config = Some(PathBuf::from(&a["--config=".len()..])),
            other => return Err(format!("unknown argument {other:?}")),
        }
        i += 1;
    }
    match config {
        Some(c) => Ok(Some((mode, c))),
        None => Err("--config FILE is required".into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, file) = match parse_args(&args) {
        Ok(Some(x)) => x,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("chimerad: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let cfg = match Config::load(&file) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("chimerad: config error: {e}");
            return ExitCode::from(1);
        }
    };
    match mode {
        Mode::Check => {
            for w in &cfg.warnings {
                eprintln!("warning: {w}");
            }
            for n in &cfg.notes {
                eprintln!("note: {n}");
            }
            println!("OK");
            ExitCode::SUCCESS
        }
        Mode::Run => run(cfg),
    }
}

/// Block SIGTERM and SIGINT in this thread before any other thread exists,
/// so every thread inherits the mask and the signals are only ever consumed
/// by `sigwait` below: no async-signal-safety concerns, no lost signals.
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: plain libc calls on a local, initialised signal set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        assert_eq!(rc, 0, "pthread_sigmask failed");
        set
    }
}

fn wait_stop_signal(set: &libc::sigset_t) -> i32 {
    let mut sig: libc::c_int = 0;
    loop {
        // SAFETY: `set` is initialised and `sig` is a valid out pointer.
        let rc = unsafe { libc::sigwait(set, &mut sig) };
        if rc == 0 {
            return sig;
        }
    }
}

fn run(mut cfg: Config) -> ExitCode {
    let signals = block_stop_signals();
    chimerad::log::init(cfg.log_level, cfg.log_format);
    for w in &cfg.warnings {
        chimerad::log::warn("config", &[("warning", w.into())]);
    }
    match cfg.provide_admin_token() {
        Ok(None) => {}
        Ok(Some((file, created))) => {
            let what = if created { "admin token generated" } else { "admin token reused" };
            chimerad::log::info(what, &[("file", file.display().to_string().as_str().into())]);
        }
        Err(e) => {
            chimerad::log::error("start-up failed", &[("error", e.to_string().as_str().into())]);
            return ExitCode::from(1);
        }
    }
    let running = match chimerad::serve::start(&cfg) {
        Ok(r) => r,
        Err(e) => {
            chimerad::log::error("start-up failed", &[("error", e.as_str().into())]);
            return ExitCode::from(1);
        }
    };
    chimerad::log::info(
        "started",
        &[("version", env!("CARGO_PKG_VERSION").into()), ("role", cfg.server.role.as_str().into())],
    );
    let sig = wait_stop_signal(&signals);
    let name = if sig == libc::SIGTERM { "SIGTERM" } else { "SIGINT" };
    chimerad::log::info("stopping", &[("signal", name.into())]);
    running.shutdown();
    chimerad::log::info("stopped", &[]);
    ExitCode::SUCCESS
}
