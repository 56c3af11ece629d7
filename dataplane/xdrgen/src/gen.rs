//! Rust code generation. The conventions (names verbatim, `<'a>` only on
//! types that borrow, unions as Rust enums with one variant per case label,
//! flat `pub const`s) are a contract other crates are written against: see
//! the README of this crate before changing any of them.

use crate::parse::{Arm, Def, DefKind, Spec, Ty, Union, Value};
use crate::Error;
use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// A specification whose definitions the generated module may use, and the
/// Rust path of the module generated from it (e.g. `crate::nfs4`).
pub struct Dep<'s> {
    pub module: &'s str,
    pub spec: &'s Spec,
}

/// Longest chain of typedefs we follow before calling it a cycle.
const TYPEDEF_CHAIN_MAX: usize = 64;

struct G<'s> {
    file: &'s str,
    types: HashMap<&'s str, &'s DefKind>,
    consts: HashMap<String, i128>,
    life: HashMap<String, bool>,
}

fn pad(n: usize) -> usize {
    (4 - (n & 3)) & 3
}

fn max_expr(m: Option<u32>) -> String {
    match m {
        None | Some(u32::MAX) => "u32::MAX".into(),
        Some(m) => m.to_string(),
    }
}

/// Rust keywords are escaped as raw identifiers; the few that cannot be raw
/// get a trailing underscore.
pub fn field_name(n: &str) -> String {
    const KW: &[&str] = &[
        "as", "break", "const", "continue", "else", "enum", "extern", "false", "fn", "for", "if", "impl", "in",
        "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "static", "struct", "trait",
        "true", "type", "unsafe", "use", "where", "while", "async", "await", "dyn", "abstract", "become", "box",
        "do", "final", "macro", "override", "priv", "typeof", "unsized", "virtual", "yield", "try", "gen",
    ];
    if matches!(n, "self" | "Self" | "super" | "crate") {
        format!("{n}_")
    } else if KW.contains(&n) {
        format!("r#{n}")
    } else {
        n.to_string()
    }
}

fn variant_name(label: &Value) -> String {
    match label {
        Value::Ident(s) => s.clone(),
        Value::Num(n) if *n < 0 => format!("Vm{}", -n),
        Value::Num(n) => format!("V{n}"),
    }
}

/// How a union's discriminant is carried in Rust.
#[derive(Clone, Copy, PartialEq)]
enum Disc {
    I32,
    U32,
    Bool,
}

impl<'s> G<'s> {
    fn err<T>(&self, line: usize, msg: impl Into<String>) -> Result<T, Error> {
        Err(Error { file: self.file.to_string(), line, msg: msg.into() })
    }

    fn num(&self, v: &Value) -> i128 {
        match v {
            Value::Num(n) => *n,
            Value::Ident(s) => self.consts[s.as_str()],
        }
    }

    fn size(&self, v: &Value) -> u32 {
        self.num(v) as u32
    }

    fn resolve(&self, ty: &Ty) -> Ty {
        let mut t = ty.clone();
        for _ in 0..TYPEDEF_CHAIN_MAX {
            match &t {
                Ty::Named(n) => match self.types.get(n.as_str()) {
                    Some(DefKind::Typedef(inner)) => t = inner.clone(),
                    _ => return t,
                },
                _ => return t,
            }
        }
        t
    }

    fn life_of(&self, ty: &Ty) -> bool {
        match ty {
            Ty::OpaqueVar(_) | Ty::Str(_) => true,
            Ty::Named(n) => self.life.get(n).copied().unwrap_or(false),
            Ty::Array(e, _) | Ty::VarArray(e, _) | Ty::Optional(e) => self.life_of(e),
            _ => false,
        }
    }

    fn kind_life(&self, k: &DefKind) -> bool {
        match k {
            DefKind::Typedef(t) => self.life_of(t),
            DefKind::Struct(fs) => fs.iter().any(|f| self.life_of(&f.ty)),
            DefKind::Union(u) => {
                let arms = u.arms.iter().filter_map(|a| a.decl.as_ref());
                arms.chain(u.default.iter().flatten()).any(|d| self.life_of(&d.ty))
            }
            _ => false,
        }
    }

    fn compute_lifetimes(&mut self) {
        loop {
            let mut changed = false;
            let names: Vec<&str> = self.types.keys().copied().collect();
            for n in names {
                let l = self.kind_life(self.types[n]);
                if l && !self.life.get(n).copied().unwrap_or(false) {
                    self.life.insert(n.to_string(), true);
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
    }

    /// Rust type of `ty`; `lt` is the lifetime to write (`'a` or `'_`).
    fn rty(&self, ty: &Ty, lt: &str) -> String {
        match ty {
            Ty::Int => "i32".into(),
            Ty::UInt => "u32".into(),
            Ty::Hyper => "i64".into(),
            Ty::UHyper => "u64".into(),
            Ty::Bool => "bool".into(),
            Ty::Named(n) if self.life_of(ty) => format!("{n}<{lt}>"),
            Ty::Named(n) => n.clone(),
            Ty::OpaqueFixed(v) => format!("[u8; {}]", self.size(v)),
            Ty::OpaqueVar(_) | Ty::Str(_) => format!("&{lt} [u8]"),
            Ty::Array(e, n) => format!("[{}; {}]", self.rty(e, lt), self.size(n)),
            Ty::VarArray(e, _) => format!("Vec<{}>", self.rty(e, lt)),
            Ty::Optional(e) => format!("Option<Box<{}>>", self.rty(e, lt)),
            Ty::Float | Ty::Double | Ty::Quadruple | Ty::Anon(_) => unreachable!("rejected by check"),
        }
    }

    fn min_len(&self, ty: &Ty, seen: &mut Vec<String>) -> usize {
        match self.resolve(ty) {
            Ty::Int | Ty::UInt | Ty::Bool => 4,
            Ty::Hyper | Ty::UHyper => 8,
            Ty::OpaqueFixed(v) => {
                let n = self.size(&v) as usize;
                n + pad(n)
            }
            Ty::OpaqueVar(_) | Ty::Str(_) | Ty::VarArray(..) | Ty::Optional(_) => 4,
            Ty::Array(e, n) => self.min_len(&e, seen).saturating_mul(self.size(&n) as usize),
            Ty::Named(n) => {
                if seen.contains(&n) {
                    return 0;
                }
                seen.push(n.clone());
                let r = match self.types[n.as_str()] {
                    DefKind::Enum(_) => 4,
                    DefKind::Struct(fs) => fs.iter().map(|f| self.min_len(&f.ty, seen)).fold(0, usize::saturating_add),
                    DefKind::Union(u) => {
                        let arms = u.arms.iter().map(|a| a.decl.as_ref());
                        let all = arms.chain(u.default.iter().map(|d| d.as_ref()));
                        4 + all.map(|d| d.map_or(0, |d| self.min_len(&d.ty, seen))).min().unwrap_or(0)
                    }
                    _ => 0,
                };
                seen.pop();
                r
            }
            _ => 0,
        }
    }

    /// Encoded size when every value of the type has the same size.
    fn fixed_size(&self, ty: &Ty, depth: usize) -> Option<usize> {
        if depth > TYPEDEF_CHAIN_MAX {
            return None;
        }
        match self.resolve(ty) {
            Ty::Int | Ty::UInt | Ty::Bool => Some(4),
            Ty::Hyper | Ty::UHyper => Some(8),
            Ty::OpaqueFixed(v) => {
                let n = self.size(&v) as usize;
                Some(n + pad(n))
            }
            Ty::Array(e, n) => self.fixed_size(&e, depth + 1).map(|s| s * self.size(&n) as usize),
            Ty::Named(n) => match self.types[n.as_str()] {
                DefKind::Enum(_) => Some(4),
                DefKind::Struct(fs) => fs.iter().map(|f| self.fixed_size(&f.ty, depth + 1)).sum(),
                _ => None,
            },
            _ => None,
        }
    }

    fn dec(&self, ty: &Ty) -> String {
        let r = self.resolve(ty);
        match &r {
            Ty::Int => "d.i32()?".into(),
            Ty::UInt => "d.u32()?".into(),
            Ty::Hyper => "d.i64()?".into(),
            Ty::UHyper => "d.u64()?".into(),
            Ty::Bool => "d.bool()?".into(),
            Ty::OpaqueFixed(v) => format!("d.opaque_fixed::<{}>()?", self.size(v)),
            Ty::OpaqueVar(m) | Ty::Str(m) => {
                format!("d.opaque_var({})?", max_expr(m.as_ref().map(|v| self.size(v))))
            }
            Ty::Named(_) => format!("<{} as Xdr<'a>>::decode(d)?", self.rty(&r, "'a")),
            Ty::Array(e, n) => format!("xdr::decode_array::<_, {}>(d, |d| Ok({}))?", self.size(n), self.dec(e)),
            Ty::VarArray(e, m) => format!(
                "xdr::decode_vec(d, {}, {}, |d| Ok({}))?",
                max_expr(m.as_ref().map(|v| self.size(v))),
                self.min_len(e, &mut Vec::new()),
                self.dec(e)
            ),
            Ty::Optional(e) => format!("xdr::decode_opt(d, |d| Ok({}))?", self.dec(e)),
            _ => unreachable!(),
        }
    }

    /// Statements encoding the value `src` (an expression of type `&T`).
    fn enc(&self, ty: &Ty, src: &str) -> String {
        let body = match self.resolve(ty) {
            Ty::Int => "e.i32(*v)?;".into(),
            Ty::UInt => "e.u32(*v)?;".into(),
            Ty::Hyper => "e.i64(*v)?;".into(),
            Ty::UHyper => "e.u64(*v)?;".into(),
            Ty::Bool => "e.bool(*v)?;".into(),
            Ty::OpaqueFixed(_) => "e.opaque_fixed(&v[..])?;".into(),
            Ty::OpaqueVar(m) | Ty::Str(m) => {
                format!("xdr::encode_opaque_var(e, v, {})?;", max_expr(m.as_ref().map(|v| self.size(v))))
            }
            Ty::Named(_) => "v.encode(e)?;".into(),
            Ty::Array(el, _) => format!("for v in v.iter() {{ {} }}", self.enc(&el, "v")),
            Ty::VarArray(el, m) => format!(
                "xdr::encode_count(e, v.len(), {})?; for v in v.iter() {{ {} }}",
                max_expr(m.as_ref().map(|v| self.size(v))),
                self.enc(&el, "v")
            ),
            Ty::Optional(el) => format!(
                "match v {{ Some(v) => {{ e.bool(true)?; {} }} None => e.bool(false)?, }}",
                self.enc(&el, "&**v")
            ),
            _ => unreachable!(),
        };
        format!("{{ let v = {src}; {body} }}")
    }

    /// Expression: the encoded size of `src` (an expression of type `&T`).
    fn len(&self, ty: &Ty, src: &str) -> String {
        if let Some(k) = self.fixed_size(ty, 0) {
            return k.to_string();
        }
        let body = match self.resolve(ty) {
            Ty::OpaqueVar(_) | Ty::Str(_) => "xdr::opaque_var_len(v.len())".into(),
            Ty::Named(_) => "v.encoded_len()".into(),
            Ty::Array(el, _) => format!("v.iter().map(|v| {}).sum::<usize>()", self.len(&el, "v")),
            Ty::VarArray(el, _) => match self.fixed_size(&el, 0) {
                Some(k) => format!("4 + v.len() * {k}"),
                None => format!("4 + v.iter().map(|v| {}).sum::<usize>()", self.len(&el, "v")),
            },
            Ty::Optional(el) => format!("4 + match v {{ Some(v) => {}, None => 0 }}", self.len(&el, "&**v")),
            _ => unreachable!(),
        };
        format!("{{ let v = {src}; {body} }}")
    }

    /// Statements writing a random valid encoding of `ty` to `out`.
    fn gen(&self, ty: &Ty) -> String {
        match self.resolve(ty) {
            Ty::Int | Ty::UInt => "r.word(out);".into(),
            Ty::Hyper | Ty::UHyper => "r.hyper(out);".into(),
            Ty::Bool => "r.boolean(out);".into(),
            Ty::OpaqueFixed(v) => format!("r.opaque_fixed(out, {});", self.size(&v)),
            Ty::OpaqueVar(m) | Ty::Str(m) => {
                format!("r.opaque_var(out, {});", max_expr(m.as_ref().map(|v| self.size(v))))
            }
            Ty::Named(n) => format!("gen_{n}(r, depth, out);"),
            Ty::Array(e, n) => format!("for _ in 0..{} {{ {} }}", self.size(&n), self.gen(&e)),
            Ty::VarArray(e, m) => format!(
                "{{ let n = r.count(out, {}, depth); let depth = depth + 1; for _ in 0..n {{ {} }} }}",
                max_expr(m.as_ref().map(|v| self.size(v))),
                self.gen(&e)
            ),
            Ty::Optional(e) => format!("if r.present(out, depth) {{ let depth = depth + 1; {} }}", self.gen(&e)),
            _ => unreachable!(),
        }
    }

    /// A typedef of variable-length or array data: its maxima live only in
    /// the definition, so it gets `decode_<name>`/`encode_<name>` functions.
    fn bounded_typedef(&self, name: &str) -> bool {
        matches!(self.types.get(name), Some(DefKind::Typedef(_)))
            && !matches!(
                self.resolve(&Ty::Named(name.to_string())),
                Ty::Named(_) | Ty::Int | Ty::UInt | Ty::Hyper | Ty::UHyper | Ty::Bool
            )
    }

    fn disc_kind(&self, u: &Union) -> Disc {
        match self.resolve(&u.disc.ty) {
            Ty::UInt => Disc::U32,
            Ty::Bool => Disc::Bool,
            _ => Disc::I32,
        }
    }

    fn disc_enum(&self, u: &Union) -> Option<(String, Vec<i128>)> {
        match self.resolve(&u.disc.ty) {
            Ty::Named(n) => match self.types[n.as_str()] {
                DefKind::Enum(ms) => Some((n.clone(), ms.iter().map(|m| self.num(&m.1)).collect())),
                _ => None,
            },
            _ => None,
        }
    }

    fn lit(&self, kind: Disc, v: i128) -> String {
        match kind {
            Disc::I32 => format!("{}", v as i32),
            Disc::U32 => format!("{}u32", v as u32),
            Disc::Bool => format!("{}", v != 0),
        }
    }
}

/// Validation: every name resolves, every size fits, no unsupported type.
fn check_ty(g: &G, ty: &Ty, line: usize) -> Result<(), Error> {
    let size = |v: &Value| -> Result<(), Error> {
        if let Value::Ident(s) = v {
            if !g.consts.contains_key(s.as_str()) {
                return g.err(line, format!("unknown constant `{s}`"));
            }
        }
        let n = g.num(v);
        if !(0..=u32::MAX as i128).contains(&n) {
            return g.err(line, format!("size {n} is outside 0..=4294967295"));
        }
        Ok(())
    };
    match ty {
        Ty::Float | Ty::Double | Ty::Quadruple => g.err(line, "floating-point types are not supported"),
        Ty::Named(n) => match g.types.get(n.as_str()) {
            Some(_) => Ok(()),
            None => g.err(line, format!("unknown type `{n}`")),
        },
        Ty::OpaqueFixed(v) => size(v),
        Ty::OpaqueVar(m) | Ty::Str(m) => m.as_ref().map_or(Ok(()), size),
        Ty::Array(e, v) => {
            size(v)?;
            check_ty(g, e, line)
        }
        Ty::VarArray(e, m) => {
            m.as_ref().map_or(Ok(()), size)?;
            check_ty(g, e, line)
        }
        Ty::Optional(e) => check_ty(g, e, line),
        _ => Ok(()),
    }
}

fn const_table(specs: &[&Spec]) -> Result<HashMap<String, i128>, Error> {
    let mut raw: Vec<(&str, &Value, &str, usize)> = Vec::new();
    for s in specs {
        for d in &s.defs {
            match &d.kind {
                DefKind::Const(v) => raw.push((&d.name, v, &s.file, d.line)),
                DefKind::Enum(ms) => raw.extend(ms.iter().map(|m| (m.0.as_str(), &m.1, s.file.as_str(), m.2))),
                _ => {}
            }
        }
    }
    let mut out: HashMap<String, i128> = HashMap::new();
    out.insert("TRUE".into(), 1);
    out.insert("FALSE".into(), 0);
    // Constants may name constants defined later: resolve until nothing moves.
    let mut pending = raw;
    while !pending.is_empty() {
        let before = pending.len();
        pending.retain(|(n, v, _, _)| match v {
            Value::Num(x) => {
                out.insert(n.to_string(), *x);
                false
            }
            Value::Ident(s) => match out.get(s.as_str()) {
                Some(x) => {
                    out.insert(n.to_string(), *x);
                    false
                }
                None => true,
            },
        });
        if pending.len() == before {
            let (n, v, f, l) = pending[0];
            let Value::Ident(s) = v else { unreachable!() };
            return Err(Error { file: f.into(), line: l, msg: format!("`{n}` names unknown constant `{s}`") });
        }
    }
    Ok(out)
}

/// Generate the Rust module for `spec`. The output expects to be included
/// into a module of the `proto` crate (it uses `crate::xdr`).
pub fn generate(spec: &Spec, deps: &[Dep]) -> Result<String, Error> {
    let mut all: Vec<&Spec> = deps.iter().map(|d| d.spec).collect();
    all.push(spec);
    let consts = const_table(&all)?;
    let mut types: HashMap<&str, &DefKind> = HashMap::new();
    for s in &all {
        for d in &s.defs {
            if !matches!(d.kind, DefKind::Const(_) | DefKind::Program { .. }) {
                types.insert(d.name.as_str(), &d.kind);
            }
        }
    }
    let mut g = G { file: &spec.file, types, consts, life: HashMap::new() };

    // Names must be unique in this spec (types and values live in separate Rust
    // namespaces, as in XDR).
    let mut type_names = HashSet::new();
    // (name, value, line, may repeat with the same value): procedure names
    // legitimately repeat across versions of one program.
    let mut values: Vec<(&str, i128, usize, bool)> = Vec::new();
    for d in &spec.defs {
        match &d.kind {
            DefKind::Const(v) => values.push((&d.name, g.num(v), d.line, false)),
            DefKind::Enum(ms) => values.extend(ms.iter().map(|(n, v, l)| (n.as_str(), g.num(v), *l, false))),
            DefKind::Program { number, versions } => {
                values.push((&d.name, g.num(number), d.line, false));
                for v in versions {
                    values.push((&v.name, g.num(&v.number), v.line, true));
                    for p in &v.procs {
                        values.push((&p.name, g.num(&p.number), p.line, true));
                    }
                }
            }
            _ => {}
        }
        if !matches!(d.kind, DefKind::Const(_) | DefKind::Program { .. }) && !type_names.insert(d.name.as_str()) {
            return g.err(d.line, format!("type `{}` is defined twice", d.name));
        }
    }
    let mut value_names: HashMap<&str, (i128, bool)> = HashMap::new();
    for (n, v, line, may_repeat) in values {
        if let Some((old, old_repeat)) = value_names.insert(n, (v, may_repeat)) {
            if !(may_repeat && old_repeat && old == v) {
                return g.err(line, format!("`{n}` is defined twice"));
            }
        }
    }

    for d in &spec.defs {
        match &d.kind {
            DefKind::Typedef(t) => check_ty(&g, t, d.line)?,
            DefKind::Struct(fs) => {
                for f in fs {
                    check_ty(&g, &f.ty, f.line)?;
                }
            }
            DefKind::Union(u) => check_union(&g, u)?,
            DefKind::Enum(ms) => {
                for (n, v, l) in ms {
                    if !(i32::MIN as i128..=i32::MAX as i128).contains(&g.num(v)) {
                        return g.err(*l, format!("enum value `{n}` does not fit in 32 bits"));
                    }
                }
            }
            DefKind::Program { versions, .. } => {
                for v in versions {
                    for p in &v.procs {
                        for t in p.arg.iter().chain(p.ret.iter()) {
                            check_ty(&g, t, p.line)?;
                        }
                    }
                }
            }
            DefKind::Const(_) => {}
        }
        if let DefKind::Typedef(_) = d.kind {
            let mut t = Ty::Named(d.name.clone());
            for _ in 0..=TYPEDEF_CHAIN_MAX {
                t = match g.resolve(&t) {
                    Ty::Named(n) if n == d.name => return g.err(d.line, format!("typedef `{}` refers to itself", d.name)),
                    r => r,
                };
            }
        }
    }
    g.compute_lifetimes();

    let mut out = String::new();
    let mut tg = String::new();
    let mut types_table = Vec::new();
    let mut procs_table = Vec::new();
    writeln!(out, "// @generated by xdrgen from {}. Do not edit: change the .x file.", spec.file).unwrap();
    out.push_str("use crate::xdr::{self, Decoder, Encoder, Xdr, XdrError};\n");
    for d in deps {
        writeln!(out, "use {}::*;", d.module).unwrap();
    }
    for d in &spec.defs {
        match &d.kind {
            DefKind::Const(v) => emit_const(&mut out, &d.name, g.num(v)),
            DefKind::Typedef(t) => {
                let lt = if g.life_of(t) { "<'a>" } else { "" };
                writeln!(out, "pub type {}{lt} = {};", d.name, g.rty(t, "'a")).unwrap();
                if g.bounded_typedef(&d.name) {
                    // The alias cannot carry the typedef's maxima into the
                    // generic impls, so standalone use gets its own functions.
                    let named = Ty::Named(d.name.clone());
                    writeln!(
                        out,
                        "/// Decode a `{n}` on its own, enforcing the maxima of its definition.\n\
                         pub fn decode_{n}<'a>(d: &mut Decoder<'a>) -> xdr::Result<{ra}> {{ Ok({dec}) }}\n\
                         /// Encode a `{n}` on its own, enforcing the maxima of its definition.\n\
                         pub fn encode_{n}(v: &{ru}, e: &mut Encoder<'_>) -> xdr::Result<()> {{ {enc} Ok(()) }}",
                        n = d.name,
                        ra = g.rty(&named, "'a"),
                        ru = g.rty(&named, "'_"),
                        dec = g.dec(t),
                        enc = g.enc(t, "v"),
                    )
                    .unwrap();
                }
                writeln!(tg, "pub fn gen_{}(r: &mut Rng, depth: u32, out: &mut Vec<u8>) {{ {} }}", d.name, g.gen(t)).unwrap();
                types_table.push(d.name.clone());
            }
            DefKind::Enum(ms) => {
                emit_enum(&g, &mut out, &mut tg, &d.name, ms);
                types_table.push(d.name.clone());
            }
            DefKind::Struct(fs) => {
                emit_struct(&g, &mut out, &mut tg, d);
                let _ = fs;
                types_table.push(d.name.clone());
            }
            DefKind::Union(u) => {
                emit_union(&g, &mut out, &mut tg, &d.name, u);
                types_table.push(d.name.clone());
            }
            DefKind::Program { number, versions } => {
                emit_program(&g, &mut out, &mut tg, &mut procs_table, &d.name, g.num(number), versions)
            }
        }
    }

    // Property-test support: random valid encodings and round-trip checks.
    out.push_str("\n/// Random valid encodings and round-trip checks of every type (tests and fuzzing).\n");
    out.push_str("#[cfg(any(test, feature = \"testgen\"))]\npub mod testgen {\n");
    out.push_str("use super::*;\nuse crate::xdr::testgen::{Rng, Proc, TypeCheck};\n");
    for d in deps {
        writeln!(out, "use {}::testgen::*;", d.module).unwrap();
    }
    out.push_str(&tg);
    for n in &types_table {
        let ty = Ty::Named(n.clone());
        writeln!(out, "pub fn check_{n}(buf: &[u8]) -> xdr::Result<(usize, Vec<u8>)> {{ {} }}", check_body(&g, &ty)).unwrap();
    }
    out.push_str("/// Every type of this specification.\npub const TYPES: &[TypeCheck] = &[\n");
    for n in &types_table {
        writeln!(out, "    TypeCheck {{ name: \"{n}\", gen: gen_{n}, check: check_{n} }},").unwrap();
    }
    out.push_str("];\n/// Every procedure of every program version in this specification.\npub const PROCEDURES: &[Proc] = &[\n");
    for p in &procs_table {
        writeln!(out, "    {p},").unwrap();
    }
    out.push_str("];\n}\n");
    Ok(out)
}

fn check_union(g: &G, u: &Union) -> Result<(), Error> {
    let line = u.disc.line;
    check_ty(g, &u.disc.ty, line)?;
    match g.resolve(&u.disc.ty) {
        Ty::Int | Ty::UInt | Ty::Bool => {}
        Ty::Named(n) if matches!(g.types[n.as_str()], DefKind::Enum(_)) => {}
        _ => return g.err(line, "a union discriminant must be int, unsigned int, bool or an enum"),
    }
    let kind = g.disc_kind(u);
    let mut seen = HashMap::new();
    for a in &u.arms {
        for (l, ln) in &a.labels {
            if let Value::Ident(s) = l {
                if !g.consts.contains_key(s.as_str()) {
                    return g.err(*ln, format!("unknown case label `{s}`"));
                }
            }
            let v = g.num(l);
            let ok = match kind {
                Disc::I32 => (i32::MIN as i128..=i32::MAX as i128).contains(&v),
                Disc::U32 => (0..=u32::MAX as i128).contains(&v),
                Disc::Bool => v == 0 || v == 1,
            };
            if !ok {
                return g.err(*ln, format!("case label {v} does not fit the discriminant type"));
            }
            if let Some(prev) = seen.insert(v, variant_name(l)) {
                return g.err(*ln, format!("case value {v} repeats label `{prev}`"));
            }
        }
        if let Some(d) = &a.decl {
            check_ty(g, &d.ty, d.line)?;
        }
    }
    if let Some(Some(d)) = &u.default {
        check_ty(g, &d.ty, d.line)?;
    }
    Ok(())
}

fn emit_const(out: &mut String, name: &str, v: i128) {
    if (0..=u32::MAX as i128).contains(&v) {
        writeln!(out, "pub const {name}: u32 = {v};").unwrap();
    } else if (i64::MIN as i128..=i64::MAX as i128).contains(&v) {
        writeln!(out, "pub const {name}: i64 = {v};").unwrap();
    } else {
        writeln!(out, "pub const {name}: u64 = {v};").unwrap();
    }
}

/// Body of a `check_*` function: decode, re-encode, cross-check.
fn check_body(g: &G, ty: &Ty) -> String {
    let rty = g.rty(ty, "'_");
    let (dec, enc, len) = match ty {
        Ty::Named(n) if g.bounded_typedef(n) => {
            (format!("decode_{n}(&mut D)"), format!("encode_{n}(&v, &mut e)"), g.len(ty, "&v"))
        }
        _ => (format!("<{rty} as Xdr>::decode(&mut D)"), "v.encode(&mut e)".to_string(), "v.encoded_len()".to_string()),
    };
    let dec1 = dec.replace("&mut D", "&mut d");
    let dec2 = dec.replace("&mut D", "&mut d2");
    format!(
        "let mut d = Decoder::new(buf); let v: {rty} = {dec1}?; let used = d.position(); \
         let n = {len}; let mut out = vec![0u8; n]; \
         let wrote = {{ let mut e = Encoder::new(&mut out); {enc}.expect(\"a decoded value must encode\"); e.position() }}; \
         assert_eq!(wrote, n, \"encoded_len disagrees with encode for {rty}\"); \
         {{ let mut d2 = Decoder::new(&out); let v2: {rty} = {dec2}.expect(\"our own encoding must decode\"); \
         assert_eq!(d2.position(), n, \"re-decode of {rty} left bytes\"); assert_eq!(v, v2, \"decode(encode(v)) != v for {rty}\"); }} \
         Ok((used, out))"
    )
}

fn lt_params(g: &G, name: &str) -> (&'static str, &'static str) {
    if g.life.get(name).copied().unwrap_or(false) {
        ("<'a>", "<'a>")
    } else {
        ("", "")
    }
}

fn emit_enum(g: &G, out: &mut String, tg: &mut String, name: &str, ms: &[(String, Value, usize)]) {
    out.push_str("\n#[repr(i32)]\n#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]\n");
    writeln!(out, "pub enum {name} {{").unwrap();
    for (n, v, _) in ms {
        writeln!(out, "    {n} = {},", g.num(v)).unwrap();
    }
    out.push_str("}\n");
    for (n, v, _) in ms {
        writeln!(out, "pub const {n}: i32 = {};", g.num(v)).unwrap();
    }
    writeln!(out, "impl {name} {{\n    /// The member with wire value `v`, if any.\n    pub const fn from_i32(v: i32) -> Option<Self> {{\n        match v {{").unwrap();
    for (n, v, _) in ms {
        writeln!(out, "            {} => Some(Self::{n}),", g.num(v)).unwrap();
    }
    out.push_str("            _ => None,\n        }\n    }\n}\n");
    writeln!(
        out,
        "impl<'a> Xdr<'a> for {name} {{
    const MIN_LEN: usize = 4;
    #[inline]
    fn decode(d: &mut Decoder<'a>) -> xdr::Result<Self> {{
        let v = d.i32()?;
        Self::from_i32(v).ok_or(XdrError::BadEnum {{ name: \"{name}\", value: v }})
    }}
    #[inline]
    fn encode(&self, e: &mut Encoder<'_>) -> xdr::Result<()> {{ e.i32(*self as i32) }}
    #[inline]
    fn encoded_len(&self) -> usize {{ 4 }}
}}"
    )
    .unwrap();
    let vals: Vec<String> = ms.iter().map(|m| format!("{}", g.num(&m.1) as i32)).collect();
    writeln!(
        tg,
        "pub fn gen_{name}(r: &mut Rng, _depth: u32, out: &mut Vec<u8>) {{ const V: &[i32] = &[{}]; let i = r.below(V.len() as u64) as usize; r.put_i32(out, V[i]); }}",
        vals.join(", ")
    )
    .unwrap();
}

fn emit_struct(g: &G, out: &mut String, tg: &mut String, d: &Def) {
    let DefKind::Struct(fs) = &d.kind else { unreachable!() };
    let name = &d.name;
    let (lp, la) = lt_params(g, name);
    out.push_str("\n#[derive(Debug, Clone, PartialEq, Eq)]\n");
    writeln!(out, "pub struct {name}{lp} {{").unwrap();
    for f in fs {
        writeln!(out, "    pub {}: {},", field_name(&f.name), g.rty(&f.ty, "'a")).unwrap();
    }
    out.push_str("}\n");
    let min = g.min_len(&Ty::Named(name.clone()), &mut Vec::new());
    // A struct whose last member points to its own type is a linked list
    // (entry3, pmaplist, ...): handled with loops, so a long list costs no
    // stack depth while decoding or encoding.
    let is_list = fs.last().is_some_and(|f| match g.resolve(&f.ty) {
        Ty::Optional(e) => g.resolve(&e) == Ty::Named(name.clone()),
        _ => false,
    });
    writeln!(out, "impl<'a> Xdr<'a> for {name}{la} {{\n    const MIN_LEN: usize = {min};").unwrap();
    if is_list {
        let (last, head) = fs.split_last().unwrap();
        let lastf = field_name(&last.name);
        out.push_str("    fn decode(d: &mut Decoder<'a>) -> xdr::Result<Self> {\n        let mut __nodes: Vec<Self> = Vec::new();\n        loop {\n");
        for f in head {
            writeln!(out, "            let {} = {};", field_name(&f.name), g.dec(&f.ty)).unwrap();
        }
        let names: Vec<String> = head.iter().map(|f| field_name(&f.name)).collect();
        writeln!(
            out,
            "            let __more = d.bool()?;\n            __nodes.push(Self {{ {}{lastf}: None }});\n            if !__more {{ break; }}\n            if __nodes.len() >= xdr::LIST_MAX {{ return Err(XdrError::TooLong {{ len: __nodes.len() as u32 + 1, max: xdr::LIST_MAX as u32 }}); }}\n        }}\n        Ok(xdr::link_list(__nodes, |n| &mut n.{lastf}))\n    }}",
            names.iter().map(|n| format!("{n}, ")).collect::<String>()
        )
        .unwrap();
        out.push_str("    fn encode(&self, e: &mut Encoder<'_>) -> xdr::Result<()> {\n        let mut cur = self;\n        loop {\n");
        for f in head {
            writeln!(out, "            {}", g.enc(&f.ty, &format!("&cur.{}", field_name(&f.name)))).unwrap();
        }
        writeln!(out, "            match &cur.{lastf} {{ Some(n) => {{ e.bool(true)?; cur = &**n; }} None => return e.bool(false), }}\n        }}\n    }}").unwrap();
        out.push_str("    fn encoded_len(&self) -> usize {\n        let mut cur = self;\n        let mut n = 0usize;\n        loop {\n            n += 4");
        for f in head {
            write!(out, " + {}", g.len(&f.ty, &format!("&cur.{}", field_name(&f.name)))).unwrap();
        }
        writeln!(out, ";\n            match &cur.{lastf} {{ Some(next) => cur = &**next, None => return n, }}\n        }}\n    }}\n}}").unwrap();
    } else {
        out.push_str("    fn decode(d: &mut Decoder<'a>) -> xdr::Result<Self> {\n        Ok(Self {\n");
        for f in fs {
            writeln!(out, "            {}: {},", field_name(&f.name), g.dec(&f.ty)).unwrap();
        }
        out.push_str("        })\n    }\n    fn encode(&self, e: &mut Encoder<'_>) -> xdr::Result<()> {\n");
        for f in fs {
            writeln!(out, "        {}", g.enc(&f.ty, &format!("&self.{}", field_name(&f.name)))).unwrap();
        }
        out.push_str("        Ok(())\n    }\n    fn encoded_len(&self) -> usize {\n        0");
        for f in fs {
            write!(out, " + {}", g.len(&f.ty, &format!("&self.{}", field_name(&f.name)))).unwrap();
        }
        out.push_str("\n    }\n}\n");
    }
    write!(tg, "pub fn gen_{name}(r: &mut Rng, depth: u32, out: &mut Vec<u8>) {{ ").unwrap();
    for f in fs {
        tg.push_str(&g.gen(&f.ty));
        tg.push(' ');
    }
    tg.push_str("}\n");
}

fn emit_union(g: &G, out: &mut String, tg: &mut String, name: &str, u: &Union) {
    let (lp, la) = lt_params(g, name);
    let kind = g.disc_kind(u);
    let disc_rty = match kind {
        Disc::I32 => "i32",
        Disc::U32 => "u32",
        Disc::Bool => "bool",
    };
    let labelled: Vec<(String, i128, &Arm)> =
        u.arms.iter().flat_map(|a| a.labels.iter().map(move |(l, _)| (variant_name(l), g.num(l), a))).collect();
    out.push_str("\n#[derive(Debug, Clone, PartialEq, Eq)]\n");
    writeln!(out, "pub enum {name}{lp} {{").unwrap();
    for (v, _, a) in &labelled {
        match &a.decl {
            Some(d) => writeln!(out, "    {v}({}),", g.rty(&d.ty, "'a")).unwrap(),
            None => writeln!(out, "    {v},").unwrap(),
        }
    }
    match &u.default {
        Some(Some(d)) => writeln!(out, "    default({disc_rty}, {}),", g.rty(&d.ty, "'a")).unwrap(),
        Some(None) => writeln!(out, "    default({disc_rty}),").unwrap(),
        None => {}
    }
    out.push_str("}\n");
    let min = g.min_len(&Ty::Named(name.to_string()), &mut Vec::new());
    let (get, put) = match kind {
        Disc::I32 => ("d.i32()?", "e.i32"),
        Disc::U32 => ("d.u32()?", "e.u32"),
        Disc::Bool => ("d.bool()?", "e.bool"),
    };
    let as_i32 = "disc as i32";
    writeln!(out, "impl<'a> Xdr<'a> for {name}{la} {{\n    const MIN_LEN: usize = {min};").unwrap();
    writeln!(out, "    fn decode(d: &mut Decoder<'a>) -> xdr::Result<Self> {{\n        let disc = {get};\n        #[allow(unreachable_patterns)]\n        Ok(match disc {{").unwrap();
    for (v, n, a) in &labelled {
        match &a.decl {
            Some(d) => writeln!(out, "            {} => Self::{v}({}),", g.lit(kind, *n), g.dec(&d.ty)).unwrap(),
            None => writeln!(out, "            {} => Self::{v},", g.lit(kind, *n)).unwrap(),
        }
    }
    let enum_check = g.disc_enum(u).map(|(en, _)| {
        format!("if {en}::from_i32({as_i32}).is_none() {{ return Err(XdrError::BadEnum {{ name: \"{en}\", value: {as_i32} }}); }}")
    });
    match &u.default {
        Some(body) => {
            write!(out, "            _ => {{ {} ", enum_check.clone().unwrap_or_default()).unwrap();
            match body {
                Some(d) => writeln!(out, "Self::default(disc, {}) }}", g.dec(&d.ty)).unwrap(),
                None => writeln!(out, "Self::default(disc) }}").unwrap(),
            }
        }
        None => writeln!(out, "            _ => return Err(XdrError::BadUnion {{ name: \"{name}\", value: {as_i32} }}),").unwrap(),
    }
    out.push_str("        })\n    }\n    fn encode(&self, e: &mut Encoder<'_>) -> xdr::Result<()> {\n        match self {\n");
    for (v, n, a) in &labelled {
        match &a.decl {
            Some(d) => writeln!(out, "            Self::{v}(v) => {{ {put}({})?; {} }}", g.lit(kind, *n), g.enc(&d.ty, "v")).unwrap(),
            None => writeln!(out, "            Self::{v} => {put}({})?,", g.lit(kind, *n)).unwrap(),
        }
    }
    if let Some(body) = &u.default {
        let lits: Vec<String> = labelled.iter().map(|l| g.lit(kind, l.1)).collect();
        let pat = if lits.is_empty() { "_".to_string() } else { lits.join(" | ") };
        let label_check = if lits.is_empty() {
            String::new()
        } else {
            format!("if matches!(disc, {pat}) {{ return Err(XdrError::BadUnion {{ name: \"{name}\", value: {as_i32} }}); }}")
        };
        let guard = format!("let disc = *disc; {label_check} {}", enum_check.clone().unwrap_or_default());
        match body {
            Some(d) => writeln!(out, "            Self::default(disc, v) => {{ {guard} {put}(disc)?; {} }}", g.enc(&d.ty, "v")).unwrap(),
            None => writeln!(out, "            Self::default(disc) => {{ {guard} {put}(disc)?; }}").unwrap(),
        }
    }
    out.push_str("        }\n        Ok(())\n    }\n    fn encoded_len(&self) -> usize {\n        match self {\n");
    for (v, _, a) in &labelled {
        match &a.decl {
            Some(d) => writeln!(out, "            Self::{v}(v) => 4 + {},", g.len(&d.ty, "v")).unwrap(),
            None => writeln!(out, "            Self::{v} => 4,").unwrap(),
        }
    }
    match &u.default {
        Some(Some(d)) => writeln!(out, "            Self::default(_, v) => 4 + {},", g.len(&d.ty, "v")).unwrap(),
        Some(None) => writeln!(out, "            Self::default(_) => 4,").unwrap(),
        None => {}
    }
    out.push_str("        }\n    }\n}\n");

    // Random generator: any labelled arm, or the default arm with a
    // discriminant no label claims (valid for the enum, if it is one).
    let mut options: Vec<(u32, Option<&Ty>)> =
        labelled.iter().map(|(_, n, a)| (*n as i64 as u32, a.decl.as_ref().map(|d| &d.ty))).collect();
    if let Some(body) = &u.default {
        let taken: HashSet<i128> = labelled.iter().map(|l| l.1).collect();
        let free = match (g.disc_enum(u), kind) {
            (Some((_, vals)), _) => vals.into_iter().find(|v| !taken.contains(v)),
            (None, Disc::Bool) => [0, 1].into_iter().find(|v| !taken.contains(v)),
            (None, _) => Some(taken.iter().copied().max().map_or(0, |m| m + 1)).filter(|v| {
                (kind == Disc::U32 && *v <= u32::MAX as i128) || (kind == Disc::I32 && *v <= i32::MAX as i128)
            }),
        };
        if let Some(v) = free {
            options.push((v as i64 as u32, body.as_ref().map(|d| &d.ty)));
        }
    }
    writeln!(tg, "pub fn gen_{name}(r: &mut Rng, depth: u32, out: &mut Vec<u8>) {{ match r.below({}) {{", options.len()).unwrap();
    for (i, (v, ty)) in options.iter().enumerate() {
        let body = ty.map(|t| g.gen(t)).unwrap_or_default();
        let pat = if i + 1 == options.len() { "_".to_string() } else { i.to_string() };
        writeln!(tg, "    {pat} => {{ r.put_u32(out, {v}); {body} }}").unwrap();
    }
    tg.push_str("} }\n");
}

fn emit_program(
    g: &G,
    out: &mut String,
    tg: &mut String,
    procs_table: &mut Vec<String>,
    name: &str,
    number: i128,
    versions: &[crate::parse::Version],
) {
    writeln!(out, "\npub const {name}: u32 = {};", number as u32).unwrap();
    for v in versions {
        let vn = g.num(&v.number) as u32;
        writeln!(out, "pub const {}: u32 = {vn};", v.name).unwrap();
        for p in &v.procs {
            writeln!(out, "pub const {}: u32 = {};", p.name, g.num(&p.number) as u32).unwrap();
        }
        writeln!(out, "/// (number, name) of every procedure of version {} of {name}.", v.name).unwrap();
        writeln!(out, "pub const {}_PROCEDURES: &[(u32, &str)] = &[", v.name).unwrap();
        for p in &v.procs {
            writeln!(out, "    ({}, \"{}\"),", g.num(&p.number) as u32, p.name).unwrap();
        }
        out.push_str("];\n");
        for p in &v.procs {
            let pn = g.num(&p.number) as u32;
            let mut fns = Vec::new();
            for (what, ty) in [("args", &p.arg), ("res", &p.ret)] {
                let f = format!("{what}_{}_{}", v.name, p.name);
                let (gen, check) = match ty {
                    None => (String::new(), "Ok((0, Vec::new()))".to_string()),
                    Some(t) => (g.gen(t), check_body(g, t)),
                };
                writeln!(tg, "fn gen_{f}(r: &mut Rng, depth: u32, out: &mut Vec<u8>) {{ {gen} }}").unwrap();
                writeln!(tg, "fn check_{f}(buf: &[u8]) -> xdr::Result<(usize, Vec<u8>)> {{ {check} }}").unwrap();
                fns.push(f);
            }
            procs_table.push(format!(
                "Proc {{ program: {}, version: {vn}, proc: {pn}, name: \"{}\", gen_args: gen_{a}, check_args: check_{a}, gen_res: gen_{r}, check_res: check_{r} }}",
                number as u32, p.name, a = fns[0], r = fns[1]
            ));
        }
    }
}
