//! xdrgen: a small XDR-language (RFC 4506 section 6, with the RFC 5531
//! program syntax) parser and Rust code generator, run from `proto/build.rs`.
//!
//! The generated code borrows from the receive buffer, checks every length
//! against its declared maximum and against what is left, and writes into
//! the caller's buffer; see README.md for the naming conventions it follows.

mod gen;
mod lex;
mod parse;

pub use gen::{field_name, generate, Dep};
pub use parse::{Arm, Decl, Def, DefKind, Procedure, Spec, Ty, Union, Value, Version};

use std::fmt;
use std::path::Path;

/// A problem in a specification, located by file and line.
#[derive(Debug, Clone, PartialEq)]
pub struct Error {
    pub file: String,
    pub line: usize,
    pub msg: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.msg)
    }
}

impl std::error::Error for Error {}

/// Parse specification text; `file` names it in error messages.
pub fn parse_str(file: &str, src: &str) -> Result<Spec, Error> {
    let toks = lex::lex(file, src)?;
    parse::parse(file, &toks)
}

/// Parse a specification file.
pub fn parse_file(path: &Path) -> Result<Spec, Error> {
    let name = path.display().to_string();
    let src = std::fs::read_to_string(path).map_err(|e| Error { file: name.clone(), line: 0, msg: e.to_string() })?;
    parse_str(&name, &src)
}

#[cfg(test)]
mod tests;
