//! Tests of the generator itself. What they prove: spec errors are reported
//! as `file:line: message` naming the problem; the language features the
//! RFC specs use parse (anonymous nested types, fall-through cases,
//! `%` lines, comments, programs); and the generated code follows the
//! naming/lifetime conventions other crates rely on. (That the generated
//! code is correct on the wire is proven by proto's round-trip tests.)

use crate::{generate, parse_str, DefKind, Ty};

fn gen(src: &str) -> String {
    let spec = parse_str("t.x", src).unwrap_or_else(|e| panic!("parse: {e}"));
    generate(&spec, &[]).unwrap_or_else(|e| panic!("generate: {e}"))
}

fn error_of(src: &str) -> String {
    let r = parse_str("t.x", src).and_then(|s| generate(&s, &[]).map(|_| ()));
    match r {
        Err(e) => e.to_string(),
        Ok(()) => panic!("spec was accepted:\n{src}"),
    }
}

#[test]
fn spec_errors_name_file_line_and_problem() {
    let cases: &[(&str, &str)] = &[
        ("struct a {\n int x;\n foo y;\n};", "t.x:3: unknown type `foo`"),
        ("struct a { int x; };\nstruct a { int y; };", "t.x:2: type `a` is defined twice"),
        ("const A = 1;\nconst A = 2;", "t.x:2: `A` is defined twice"),
        ("const A = 1;\nenum e { A = 1 };", "t.x:2: `A` is defined twice"),
        ("struct a {\n int x\n};", "t.x:3: expected `;`, found `}`"),
        ("\n\nstruct a { int x; } @", "t.x:3: unexpected character `@`"),
        ("#include <x.h>", "t.x:1: C preprocessor directives are not supported"),
        ("/* never closed\n", "t.x:1: unterminated comment"),
        ("struct a {\n float f;\n};", "t.x:2: floating-point types are not supported"),
        ("typedef opaque o<N>;", "t.x:1: unknown constant `N`"),
        ("typedef opaque o[-1];", "t.x:1: size -1 is outside"),
        ("union u switch (int d) {\n case 1: int a;\n case 1: int b;\n};", "t.x:3: case value 1 repeats label `V1`"),
        ("union u switch (bool b) {\n case 2: void;\n};", "t.x:2: case label 2 does not fit"),
        ("union u switch (opaque o<>) { case 1: void; };", "a union discriminant must be int"),
        ("union u switch (int d) { case X: void; };", "t.x:1: unknown case label `X`"),
        ("typedef b a;\ntypedef a b;", "refers to itself"),
        ("enum e { A = 0x100000000 };", "t.x:1: enum value `A` does not fit in 32 bits"),
        ("const X = 0x10000000000000000;", "t.x:1: number `0x10000000000000000` does not fit in 64 bits"),
        ("program P { version V { void F(int, int) = 1; } = 1; } = 1;", "more than one argument"),
        ("struct { int x; } a;", "t.x:1: expected an identifier, found `{`"),
    ];
    for (src, want) in cases {
        let got = error_of(src);
        assert!(got.contains(want), "spec:\n{src}\nwant error containing: {want}\ngot: {got}");
    }
}

#[test]
fn rfc_language_features_parse() {
    let src = "
%#include <rpc/rpc.h>     /* rpcgen passthrough, ignored */
// a line comment
const MAXLEN = 0x10;
const BIG = 0xffffffffffffffff;
const NEG = -5;
const OCT = 010;
enum color { RED = 0, GREEN = 1 };
struct msg {
    unsigned int xid;
    union switch (color c) {
    case RED:
    case GREEN:
        struct { unsigned hyper low; hyper high; } range;
    } body;
};
program P { version V1 { void NULLPROC(void) = 0; msg GET(int) = 1; } = 1; } = 0x20000001;
";
    let spec = parse_str("t.x", src).unwrap();
    let names: Vec<&str> = spec.defs.iter().map(|d| d.name.as_str()).collect();
    assert!(names.contains(&"msg_body"), "anonymous union hoisted as <outer>_<field>: {names:?}");
    assert!(names.contains(&"msg_body_range"), "nested anonymous struct hoisted: {names:?}");
    let body = spec.defs.iter().find(|d| d.name == "msg").unwrap();
    let DefKind::Struct(fields) = &body.kind else { panic!() };
    assert_eq!(fields[1].ty, Ty::Named("msg_body".into()));
    let code = generate(&spec, &[]).unwrap();
    for want in [
        "pub const MAXLEN: u32 = 16;",
        "pub const BIG: u64 = 18446744073709551615;",
        "pub const NEG: i64 = -5;",
        "pub const OCT: u32 = 8;",
        "pub const P: u32 = 536870913;",
        "pub const GET: u32 = 1;",
        "pub const V1_PROCEDURES: &[(u32, &str)]",
        "pub enum msg_body {",
        "    RED(msg_body_range),",
        "    GREEN(msg_body_range),",
        "pub const RED: i32 = 0;",
    ] {
        assert!(code.contains(want), "generated code lacks `{want}`");
    }
}

#[test]
fn generated_code_follows_the_naming_and_lifetime_conventions() {
    let code = gen("
const FHSIZE = 64;
typedef string name<255>;
typedef opaque verf[8];
struct fh { opaque data<FHSIZE>; };
struct plain { unsigned hyper size; hyper off; bool ok; verf v; };
struct node { name n; unsigned int type; node *next; };
struct holder { node *first; int nums<4>; };
union res switch (int status) { case 0: fh ok; case 1: void; default: plain other; };
union flag switch (bool b) { case TRUE: int x; case FALSE: void; };
");
    for want in [
        "pub type name<'a> = &'a [u8];",
        "pub type verf = [u8; 8];",
        "pub struct fh<'a> {\n    pub data: &'a [u8],",
        "pub struct plain {\n    pub size: u64,\n    pub off: i64,\n    pub ok: bool,\n    pub v: verf,",
        "pub struct node<'a> {",
        "    pub r#type: u32,",
        "    pub next: Option<Box<node<'a>>>,",
        "pub struct holder<'a> {\n    pub first: Option<Box<node<'a>>>,\n    pub nums: Vec<i32>,",
        "pub enum res<'a> {\n    V0(fh<'a>),\n    V1,\n    default(i32, plain),",
        "pub enum flag {\n    TRUE(i32),\n    FALSE,",
        // Lengths are checked against the declared maximum while decoding.
        "d.opaque_var(64)?",
        "d.opaque_var(255)?",
        "xdr::decode_vec(d, 4, 4,",
        // A self-referencing tail is walked with a loop, not recursion.
        "xdr::link_list(__nodes, |n| &mut n.next)",
    ] {
        assert!(code.contains(want), "generated code lacks:\n{want}\n---\n{code}");
    }
}
