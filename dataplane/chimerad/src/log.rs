//! Structured logs: one line per event on stderr, JSON by default
//! (`{"ts":"2026-11-22T01:30:00.123Z","level":"info","msg":"listening","port":2049}`)
//! or `key=value` (`common.log_format: "kv"`).
//!
//! Control-path only (start-up, admin API, shutdown): the data path counts
//! into metrics instead of logging per request. The level comes from
//! `common.log_level`, overridden by the `CHIMERA_LOG` environment variable so
//! an operator can raise it without editing the ConfigMap.

use crate::config::{LogFormat, LogLevel};
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};

static LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Info as u8);
static FORMAT: AtomicU8 = AtomicU8::new(0);

/// Environment variable overriding `common.log_level`.
pub const LEVEL_ENV: &str = "CHIMERA_LOG";

pub fn init(level: LogLevel, format: LogFormat) {
    let level = std::env::var(LEVEL_ENV).ok().and_then(|s| LogLevel::parse(&s)).unwrap_or(level);
    LEVEL.store(level as u8, Ordering::Relaxed);
    FORMAT.store(if format == LogFormat::Json { 0 } else { 1 }, Ordering::Relaxed);
}

pub fn enabled(level: LogLevel) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// A field value: strings are quoted/escaped, numbers and booleans are not.
pub enum V<'a> {
    S(&'a str),
    U(u64),
    I(i64),
    B(bool),
}

impl<'a> From<&'a str> for V<'a> {
    fn from(s: &'a str) -> V<'a> {
        V::S(s)
    }
}
impl<'a> From<&'a String> for V<'a> {
    fn from(s: &'a String) -> V<'a> {
        V::S(s.as_str())
    }
}
impl From<u64> for V<'_> {
    fn from(n: u64) -> Self {
        V::U(n)
    }
}
impl From<u32> for V<'_> {
    fn from(n: u32) -> Self {
        V::U(n as u64)
    }
}
impl From<u16> for V<'_> {
    fn from(n: u16) -> Self {
        V::U(n as u64)
    }
}
impl From<usize> for V<'_> {
    fn from(n: usize) -> Self {
        V::U(n as u64)
    }
}
impl From<i64> for V<'_> {
    fn from(n: i64) -> Self {
        V::I(n)
    }
}
impl From<bool> for V<'_> {
    fn from(b: bool) -> Self {
        V::B(b)
    }
}

/// Emit one event. The whole line is written with one `write_all` on a
/// locked stderr so lines from different threads never interleave.
pub fn event(level: LogLevel, msg: &str, fields: &[(&str, V<'_>)]) {
    if !enabled(level) {
        return;
    }
    let line = format_line(FORMAT.load(Ordering::Relaxed) == 0, &timestamp(), level, msg, fields);
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

pub fn error(msg: &str, fields: &[(&str, V<'_>)]) {
    event(LogLevel::Error, msg, fields)
}
pub fn warn(msg: &str, fields: &[(&str, V<'_>)]) {
    event(LogLevel::Warn, msg, fields)
}
pub fn info(msg: &str, fields: &[(&str, V<'_>)]) {
    event(LogLevel::Info, msg, fields)
}
pub fn debug(msg: &str, fields: &[(&str, V<'_>)]) {
    event(LogLevel::Debug, msg, fields)
}

pub fn format_line(json: bool, ts: &str, level: LogLevel, msg: &str, fields: &[(&str, V<'_>)]) -> String {
    let mut s = String::with_capacity(96);
    if json {
        s.push_str("{\"ts\":\"");
        s.push_str(ts);
        s.push_str("\",\"level\":\"");
        s.push_str(level.as_str());
        s.push_str("\",\"msg\":");
        push_json_str(&mut s, msg);
        for (k, v) in fields {
            s.push(',');
            push_json_str(&mut s, k);
            s.push(':');
            push_value(&mut s, v, true);
        }
        s.push_str("}\n");
    } else {
        s.push_str("ts=");
        s.push_str(ts);
        s.push_str(" level=");
        s.push_str(level.as_str());
        s.push_str(" msg=");
        push_json_str(&mut s, msg);
        for (k, v) in fields {
            s.push(' ');
            s.push_str(k);
            s.push('=');
            push_value(&mut s, v, false);
        }
        s.push('\n');
    }
    s
}

fn push_value(s: &mut String, v: &V<'_>, json: bool) {
    match v {
        V::S(x) => {
            // In kv form, bare words stay bare; anything else is quoted.
            if !json && !x.is_empty() && x.bytes().all(|c| c.is_ascii_graphic() && c != b'"' && c != b'=') {
                s.push_str(x)
            } else {
                push_json_str(s, x)
            }
        }
        V::U(n) => s.push_str(&n.to_string()),
        V::I(n) => s.push_str(&n.to_string()),
        V::B(b) => s.push_str(if *b { "true" } else { "false" }),
    }
}

/// JSON string escaping (RFC 8259 §7): quote, backslash and control characters.
fn push_json_str(s: &mut String, x: &str) {
    s.push('"');
    for c in x.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if (c as u32) < 0x20 => s.push_str(&format!("\\u{:04x}", c as u32)),
            c => s.push(c),
        }
    }
    s.push('"');
}

/// UTC RFC 3339 timestamp with milliseconds.
pub fn timestamp() -> String {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format_rfc3339_ms(d.as_secs(), d.subsec_millis())
}

pub fn format_rfc3339_ms(secs: u64, ms: u32) -> String {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's era-based algorithm, reimplemented).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y, m, d)
}

#[cfg(test)]
mod tests {
    //! Proves log lines are single-line, parseable JSON (hostile strings
    //! included) and that timestamps are correct calendar dates.
    use super::*;

    #[test]
    fn json_line_parses_and_escapes() {
        let line = format_line(
            true,
            "2026-11-22T01:00:00.000Z",
            LogLevel::Warn,
            "bad \"thing\"\n",
            &[("path", V::S("a\\b\u{1}")), ("n", V::U(7)), ("ok", V::B(false))],
        );
        assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(v["level"], "warn");
        assert_eq!(v["msg"], "bad \"thing\"\n");
        assert_eq!(v["path"], "a\\b\u{1}");
        assert_eq!(v["n"], 7);
        assert_eq!(v["ok"], false);
    }

    #[test]
    fn kv_line() {
        let line = format_line(false, "T", LogLevel::Info, "listening", &[("addr", V::S("127.0.0.1:1")), ("s", V::S("a b"))]);
        assert_eq!(line, "ts=T level=info msg=\"listening\" addr=127.0.0.1:1 s=\"a b\"\n");
    }

    #[test]
    fn timestamps() {
        assert_eq!(format_rfc3339_ms(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_rfc3339_ms(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(format_rfc3339_ms(1_795_395_661, 999), "2026-11-23T01:01:01.999Z");
    }
}
