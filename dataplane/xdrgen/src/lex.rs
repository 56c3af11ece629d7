//! Tokens of the XDR language (RFC 4506 section 6.2 notation, plus the
//! program/version syntax of RFC 5531 section 12 and rpcgen's `%` lines).

use crate::Error;

#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    Ident(String),
    Num(i128),
    Punct(char),
}

#[derive(Debug, Clone)]
pub struct Token {
    pub tok: Tok,
    pub line: usize,
}

/// Largest literal we accept: anything wider cannot be a 64-bit constant.
const LITERAL_MAX: i128 = u64::MAX as i128;

pub fn lex(file: &str, src: &str) -> Result<Vec<Token>, Error> {
    let err = |line: usize, msg: String| Error { file: file.to_string(), line, msg };
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let mut at_line_start = true;
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
            at_line_start = true;
            continue;
        }
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        // rpcgen passthrough lines: copied to C output by rpcgen, meaningless to us.
        if at_line_start && c == b'%' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if at_line_start && c == b'#' {
            return Err(err(line, "C preprocessor directives are not supported; write the definition out".into()));
        }
        at_line_start = false;
        if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let start = line;
            i += 2;
            loop {
                if i + 1 >= b.len() {
                    return Err(err(start, "unterminated comment".into()));
                }
                if b[i] == b'*' && b[i + 1] == b'/' {
                    i += 2;
                    break;
                }
                if b[i] == b'\n' {
                    line += 1;
                }
                i += 1;
            }
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Token { tok: Tok::Ident(src[s..i].to_string()), line });
            continue;
        }
        if c.is_ascii_digit() || (c == b'-' && b.get(i + 1).is_some_and(|d| d.is_ascii_digit())) {
            let neg = c == b'-';
            if neg {
                i += 1;
            }
            let s = i;
            while i < b.len() && b[i].is_ascii_alphanumeric() {
                i += 1;
            }
            let text = &src[s..i];
            let parsed = if let Some(h) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
                i128::from_str_radix(h, 16)
            } else if text.len() > 1 && text.starts_with('0') {
                i128::from_str_radix(&text[1..], 8)
            } else {
                text.parse::<i128>()
            };
            let v = parsed.map_err(|_| err(line, format!("bad number `{text}`")))?;
            if v > LITERAL_MAX {
                return Err(err(line, format!("number `{text}` does not fit in 64 bits")));
            }
            out.push(Token { tok: Tok::Num(if neg { -v } else { v }), line });
            continue;
        }
        if b"{}()[]<>;:,=*".contains(&c) {
            out.push(Token { tok: Tok::Punct(c as char), line });
            i += 1;
            continue;
        }
        return Err(err(line, format!("unexpected character `{}`", c as char)));
    }
    Ok(out)
}
