//! Parser for the XDR language (RFC 4506 section 6.3) with RFC 5531 program
//! definitions. Anonymous struct/union/enum types written inside a
//! declaration are hoisted into named definitions called `<outer>_<field>`.

use crate::lex::{Tok, Token};
use crate::Error;

/// A constant in the spec: a literal or the name of a const / enum member.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Num(i128),
    Ident(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Ty {
    Int,
    UInt,
    Hyper,
    UHyper,
    Bool,
    Float,
    Double,
    Quadruple,
    /// A named type: typedef, enum, struct or union.
    Named(String),
    OpaqueFixed(Value),
    /// `opaque x<N>`; `None` is `<>` (2^32 - 1).
    OpaqueVar(Option<Value>),
    Str(Option<Value>),
    Array(Box<Ty>, Value),
    VarArray(Box<Ty>, Option<Value>),
    Optional(Box<Ty>),
    /// An anonymous type body, replaced by `Named` when hoisted.
    Anon(Box<DefKind>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decl {
    pub name: String,
    pub ty: Ty,
    pub line: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Arm {
    pub labels: Vec<(Value, usize)>,
    /// `None` is a `void` arm.
    pub decl: Option<Decl>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Union {
    pub disc: Decl,
    pub arms: Vec<Arm>,
    /// `Some(None)` is `default: void;`.
    pub default: Option<Option<Decl>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Procedure {
    pub name: String,
    /// `None` is void.
    pub ret: Option<Ty>,
    pub arg: Option<Ty>,
    pub number: Value,
    pub line: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Version {
    pub name: String,
    pub number: Value,
    pub procs: Vec<Procedure>,
    pub line: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum DefKind {
    Const(Value),
    Typedef(Ty),
    Enum(Vec<(String, Value, usize)>),
    Struct(Vec<Decl>),
    Union(Union),
    Program { number: Value, versions: Vec<Version> },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Def {
    pub name: String,
    pub kind: DefKind,
    pub line: usize,
}

/// A parsed specification file.
#[derive(Debug, Clone)]
pub struct Spec {
    pub file: String,
    pub defs: Vec<Def>,
}

struct Parser<'t> {
    file: &'t str,
    toks: &'t [Token],
    pos: usize,
}

impl<'t> Parser<'t> {
    fn line(&self) -> usize {
        self.toks.get(self.pos).or(self.toks.last()).map_or(1, |t| t.line)
    }

    fn err<T>(&self, msg: impl Into<String>) -> Result<T, Error> {
        Err(Error { file: self.file.to_string(), line: self.line(), msg: msg.into() })
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.tok)
    }

    fn describe(&self) -> String {
        match self.peek() {
            None => "end of file".into(),
            Some(Tok::Ident(s)) => format!("`{s}`"),
            Some(Tok::Num(n)) => format!("`{n}`"),
            Some(Tok::Punct(c)) => format!("`{c}`"),
        }
    }

    fn is_punct(&self, c: char) -> bool {
        self.peek() == Some(&Tok::Punct(c))
    }

    fn is_kw(&self, k: &str) -> bool {
        matches!(self.peek(), Some(Tok::Ident(s)) if s == k)
    }

    fn punct(&mut self, c: char) -> Result<(), Error> {
        if self.is_punct(c) {
            self.pos += 1;
            Ok(())
        } else {
            self.err(format!("expected `{c}`, found {}", self.describe()))
        }
    }

    fn eat_punct(&mut self, c: char) -> bool {
        let y = self.is_punct(c);
        if y {
            self.pos += 1;
        }
        y
    }

    fn eat_kw(&mut self, k: &str) -> bool {
        let y = self.is_kw(k);
        if y {
            self.pos += 1;
        }
        y
    }

    fn kw(&mut self, k: &str) -> Result<(), Error> {
        if self.eat_kw(k) {
            Ok(())
        } else {
            self.err(format!("expected `{k}`, found {}", self.describe()))
        }
    }

    fn ident(&mut self) -> Result<String, Error> {
        match self.peek() {
            Some(Tok::Ident(s)) if !is_reserved(s) => {
                let s = s.clone();
                self.pos += 1;
                Ok(s)
            }
            _ => self.err(format!("expected an identifier, found {}", self.describe())),
        }
    }

    fn value(&mut self) -> Result<Value, Error> {
        match self.peek() {
            Some(Tok::Num(n)) => {
                let n = *n;
                self.pos += 1;
                Ok(Value::Num(n))
            }
            Some(Tok::Ident(_)) => Ok(Value::Ident(self.ident()?)),
            _ => self.err(format!("expected a constant, found {}", self.describe())),
        }
    }

    fn spec(&mut self) -> Result<Vec<Def>, Error> {
        let mut defs = Vec::new();
        while self.peek().is_some() {
            defs.push(self.definition()?);
        }
        Ok(defs)
    }

    fn definition(&mut self) -> Result<Def, Error> {
        let line = self.line();
        if self.eat_kw("const") {
            let name = self.ident()?;
            self.punct('=')?;
            let v = self.value()?;
            self.punct(';')?;
            return Ok(Def { name, kind: DefKind::Const(v), line });
        }
        if self.eat_kw("typedef") {
            let d = self.declaration()?;
            self.punct(';')?;
            let d = d.ok_or(()).or_else(|_| self.err("`typedef void` declares nothing"))?;
            // `typedef struct { ... } name;` defines the struct itself.
            let kind = match d.ty {
                Ty::Anon(k) => *k,
                ty => DefKind::Typedef(ty),
            };
            return Ok(Def { name: d.name, kind, line });
        }
        for kw in ["enum", "struct", "union"] {
            if self.eat_kw(kw) {
                let name = self.ident()?;
                let kind = self.body(kw)?;
                self.punct(';')?;
                return Ok(Def { name, kind, line });
            }
        }
        if self.eat_kw("program") {
            return self.program(line);
        }
        self.err(format!("expected a definition (const, typedef, enum, struct, union, program), found {}", self.describe()))
    }

    fn body(&mut self, kw: &str) -> Result<DefKind, Error> {
        match kw {
            "enum" => {
                self.punct('{')?;
                let mut members = Vec::new();
                loop {
                    let line = self.line();
                    let n = self.ident()?;
                    self.punct('=')?;
                    let v = self.value()?;
                    members.push((n, v, line));
                    if self.eat_punct('}') {
                        break;
                    }
                    self.punct(',')?;
                }
                Ok(DefKind::Enum(members))
            }
            "struct" => {
                self.punct('{')?;
                let mut fields = Vec::new();
                while !self.eat_punct('}') {
                    match self.declaration()? {
                        Some(d) => fields.push(d),
                        None => return self.err("`void` is not allowed as a struct member"),
                    }
                    self.punct(';')?;
                }
                Ok(DefKind::Struct(fields))
            }
            _ => {
                self.kw("switch")?;
                self.punct('(')?;
                let disc = match self.declaration()? {
                    Some(d) => d,
                    None => return self.err("a union discriminant cannot be void"),
                };
                self.punct(')')?;
                self.punct('{')?;
                let mut arms = Vec::new();
                let mut default = None;
                loop {
                    if self.eat_punct('}') {
                        break;
                    }
                    if self.eat_kw("default") {
                        if default.is_some() {
                            return self.err("second `default` arm");
                        }
                        self.punct(':')?;
                        default = Some(self.declaration()?);
                        self.punct(';')?;
                        continue;
                    }
                    let mut labels = Vec::new();
                    while self.is_kw("case") {
                        self.pos += 1;
                        let line = self.line();
                        labels.push((self.value()?, line));
                        self.punct(':')?;
                    }
                    if labels.is_empty() {
                        return self.err(format!("expected `case`, `default` or `}}`, found {}", self.describe()));
                    }
                    let decl = self.declaration()?;
                    self.punct(';')?;
                    arms.push(Arm { labels, decl });
                }
                if arms.is_empty() {
                    return self.err("a union needs at least one `case`");
                }
                Ok(DefKind::Union(Union { disc, arms, default }))
            }
        }
    }

    fn type_spec(&mut self) -> Result<Ty, Error> {
        if self.eat_kw("unsigned") {
            if self.eat_kw("hyper") {
                return Ok(Ty::UHyper);
            }
            self.eat_kw("int");
            return Ok(Ty::UInt);
        }
        let simple = [
            ("int", Ty::Int),
            ("hyper", Ty::Hyper),
            ("bool", Ty::Bool),
            ("float", Ty::Float),
            ("double", Ty::Double),
            ("quadruple", Ty::Quadruple),
        ];
        for (k, t) in simple {
            if self.eat_kw(k) {
                return Ok(t);
            }
        }
        for kw in ["enum", "struct", "union"] {
            if self.eat_kw(kw) {
                // `struct name` (C style reference) or an anonymous body.
                if matches!(self.peek(), Some(Tok::Ident(s)) if !is_reserved(s)) {
                    return Ok(Ty::Named(self.ident()?));
                }
                return Ok(Ty::Anon(Box::new(self.body(kw)?)));
            }
        }
        Ok(Ty::Named(self.ident()?))
    }

    /// `None` for `void`.
    fn declaration(&mut self) -> Result<Option<Decl>, Error> {
        if self.eat_kw("void") {
            return Ok(None);
        }
        let line = self.line();
        if self.eat_kw("opaque") || self.is_kw("string") {
            let is_string = self.eat_kw("string");
            let name = self.ident()?;
            let ty = if !is_string && self.eat_punct('[') {
                let v = self.value()?;
                self.punct(']')?;
                Ty::OpaqueFixed(v)
            } else {
                self.punct('<')?;
                let v = if self.is_punct('>') { None } else { Some(self.value()?) };
                self.punct('>')?;
                if is_string {
                    Ty::Str(v)
                } else {
                    Ty::OpaqueVar(v)
                }
            };
            return Ok(Some(Decl { name, ty, line }));
        }
        let base = self.type_spec()?;
        if self.eat_punct('*') {
            let name = self.ident()?;
            return Ok(Some(Decl { name, ty: Ty::Optional(Box::new(base)), line }));
        }
        let name = self.ident()?;
        let ty = if self.eat_punct('[') {
            let v = self.value()?;
            self.punct(']')?;
            Ty::Array(Box::new(base), v)
        } else if self.eat_punct('<') {
            let v = if self.is_punct('>') { None } else { Some(self.value()?) };
            self.punct('>')?;
            Ty::VarArray(Box::new(base), v)
        } else {
            base
        };
        Ok(Some(Decl { name, ty, line }))
    }

    fn proc_type(&mut self) -> Result<Option<Ty>, Error> {
        if self.eat_kw("void") {
            return Ok(None);
        }
        Ok(Some(self.type_spec()?))
    }

    fn program(&mut self, line: usize) -> Result<Def, Error> {
        let name = self.ident()?;
        self.punct('{')?;
        let mut versions = Vec::new();
        while !self.eat_punct('}') {
            let vline = self.line();
            self.kw("version")?;
            let vname = self.ident()?;
            self.punct('{')?;
            let mut procs = Vec::new();
            while !self.eat_punct('}') {
                let pline = self.line();
                let ret = self.proc_type()?;
                let pname = self.ident()?;
                self.punct('(')?;
                let arg = self.proc_type()?;
                if self.is_punct(',') {
                    return self.err("procedures with more than one argument are not supported");
                }
                self.punct(')')?;
                self.punct('=')?;
                let number = self.value()?;
                self.punct(';')?;
                procs.push(Procedure { name: pname, ret, arg, number, line: pline });
            }
            self.punct('=')?;
            let number = self.value()?;
            self.punct(';')?;
            versions.push(Version { name: vname, number, procs, line: vline });
        }
        self.punct('=')?;
        let number = self.value()?;
        self.punct(';')?;
        Ok(Def { name, kind: DefKind::Program { number, versions }, line })
    }
}

/// Keywords of the XDR language (RFC 4506 section 6.4) and RFC 5531.
fn is_reserved(s: &str) -> bool {
    matches!(
        s,
        "bool" | "case" | "const" | "default" | "double" | "quadruple" | "enum" | "float" | "hyper" | "int"
            | "opaque" | "string" | "struct" | "switch" | "typedef" | "union" | "unsigned" | "void"
            | "program" | "version"
    )
}

/// Replace anonymous bodies by named definitions `<outer>_<field>`.
fn hoist(defs: Vec<Def>) -> Vec<Def> {
    let mut out = Vec::new();
    for mut d in defs {
        let mut extra = Vec::new();
        hoist_kind(&d.name, &mut d.kind, d.line, &mut extra);
        out.push(d);
        out.extend(extra);
    }
    out
}

fn hoist_kind(outer: &str, kind: &mut DefKind, line: usize, extra: &mut Vec<Def>) {
    match kind {
        DefKind::Typedef(t) => hoist_ty(outer, "", t, line, extra),
        DefKind::Struct(fields) => {
            for f in fields {
                hoist_ty(outer, &f.name, &mut f.ty, f.line, extra)
            }
        }
        DefKind::Union(u) => {
            let arms = u.arms.iter_mut().filter_map(|a| a.decl.as_mut());
            for f in arms.chain(u.default.iter_mut().flatten()) {
                hoist_ty(outer, &f.name, &mut f.ty, f.line, extra)
            }
        }
        _ => {}
    }
}

fn hoist_ty(outer: &str, field: &str, ty: &mut Ty, line: usize, extra: &mut Vec<Def>) {
    match ty {
        Ty::Anon(_) => {
            let name = if field.is_empty() { outer.to_string() } else { format!("{outer}_{field}") };
            let Ty::Anon(k) = std::mem::replace(ty, Ty::Named(name.clone())) else { unreachable!() };
            let mut k = *k;
            hoist_kind(&name, &mut k, line, extra);
            extra.push(Def { name, kind: k, line });
        }
        Ty::Array(e, _) | Ty::VarArray(e, _) | Ty::Optional(e) => hoist_ty(outer, field, e, line, extra),
        _ => {}
    }
}

pub fn parse(file: &str, toks: &[Token]) -> Result<Spec, Error> {
    let mut p = Parser { file, toks, pos: 0 };
    let defs = p.spec()?;
    Ok(Spec { file: file.to_string(), defs: hoist(defs) })
}
