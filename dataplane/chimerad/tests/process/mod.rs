//! A chimerad child process for tests: its JSON log lines on a channel,
//! killed (SIGKILL) when dropped.

#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const START_TIMEOUT: Duration = Duration::from_secs(30);
pub const STOP_TIMEOUT: Duration = Duration::from_secs(20);

pub struct Proc {
    pub child: Child,
    pub lines: mpsc::Receiver<Value>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn spawn(cfg: &Path) -> Proc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_chimerad"))
        .arg("--config")
        .arg(cfg)
        .env_remove("CHIMERA_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            // A panic message is not JSON: keep it (and show it) rather than
            // lose it.
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|_| {
                eprintln!("chimerad: {line}");
                serde_json::json!({ "msg": "not JSON", "line": line })
            });
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    Proc { child, lines: rx }
}

/// Lines logged until "started" (Ok) or until the process exits (Err with
/// its exit code); panics when neither happens in time.
pub fn until_started_or_exit(p: &mut Proc) -> Result<Vec<Value>, (Option<i32>, Vec<Value>)> {
    let deadline = Instant::now() + START_TIMEOUT;
    let mut seen = Vec::new();
    loop {
        match p.lines.recv_timeout(Duration::from_millis(50)) {
            Ok(v) => {
                let started = v["msg"] == "started";
                seen.push(v);
                if started {
                    return Ok(seen);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let st = wait_exit(p);
                return Err((st.code(), seen));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        assert!(Instant::now() < deadline, "chimerad neither started nor exited within {START_TIMEOUT:?}: {seen:?}");
    }
}

pub fn wait_exit(p: &mut Proc) -> std::process::ExitStatus {
    let deadline = Instant::now() + STOP_TIMEOUT;
    loop {
        if let Some(st) = p.child.try_wait().unwrap() {
            return st;
        }
        assert!(Instant::now() < deadline, "chimerad did not exit within {STOP_TIMEOUT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn listening(lines: &[Value], service: &str) -> SocketAddr {
    let v = lines.iter().find(|v| v["msg"] == "listening" && v["service"] == service).unwrap_or_else(|| panic!("no {service} in {lines:?}"));
    v["addr"].as_str().unwrap().parse().unwrap()
}
