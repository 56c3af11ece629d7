#!/usr/bin/env python3
"""Prepares offline JSON schemas for kubeconform (strict, no network).

Kubernetes schemas come from the PyPI wheel `kubernetes-validate` (one file per
kind that `$ref`s a shared `_definitions.json`). kubeconform wants each file to
stand alone, so every file gets the closure of the definitions it references
inlined under `$defs`. CRDs (ours, plus the small hand-written schemas under
hack/schemas/ for third-party kinds we ship samples of) are converted from their
openAPIV3Schema; strict mode rejects unknown fields in them too.

usage: kubeconform-schemas.py WHEEL OUTDIR K8S_VERSION CRD_OR_SCHEMA_FILE...
Idempotent: an OUTDIR with a .done stamp for the same inputs is left alone.
"""
import hashlib
import json
import os
import re
import sys
import zipfile

REF_RE = re.compile(r'^(?:(?:/api/)?_definitions\.json)?#/\$defs/(.+)$')


def rewrite_refs(node, used):
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                m = REF_RE.match(v)
                if m:
                    used.add(m.group(1))
                    v = "#/$defs/" + m.group(1)
            out[k] = rewrite_refs(v, used)
        return out
    if isinstance(node, list):
        return [rewrite_refs(v, used) for v in node]
    return node


def standalone(doc, defs):
    used = set()
    doc = rewrite_refs(doc, used)
    closure, todo = {}, list(used)
    while todo:
        name = todo.pop()
        if name in closure:
            continue
        if name not in defs:
            raise SystemExit(f"schema references unknown definition {name}")
        more = set()
        closure[name] = rewrite_refs(defs[name], more)
        todo.extend(more - closure.keys())
    if closure:
        doc["$defs"] = closure
    return doc


def convert_k8s(wheel, outdir, version):
    with zipfile.ZipFile(wheel) as z:
        for flavour, suffix in (("local-strict", "-strict"), ("local", "")):
            prefix = f"kubernetes_validate/kubernetes-json-schema/v{version}-{flavour}/"
            names = [n for n in z.namelist() if n.startswith(prefix) and n.endswith(".json")]
            if not names:
                raise SystemExit(f"{wheel}: no schemas for v{version}-{flavour}")
            defs = json.loads(z.read(prefix + "_definitions.json"))["$defs"]
            dest = os.path.join(outdir, f"v{version}-standalone{suffix}")
            os.makedirs(dest, exist_ok=True)
            for n in names:
                base = n[len(prefix):]
                if base in ("_definitions.json", "all.json"):
                    continue
                doc = standalone(json.loads(z.read(n)), defs)
                with open(os.path.join(dest, base), "w") as f:
                    json.dump(doc, f)


def strictify(schema):
    """Unknown fields are errors, as the apiserver's pruning would drop them."""
    if isinstance(schema, dict):
        if schema.get("type") == "object" and "properties" in schema \
                and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        for v in schema.values():
            strictify(v)
    elif isinstance(schema, list):
        for v in schema:
            strictify(v)
    return schema


def convert_crd(path, outdir):
    with open(path) as f:
        text = f.read()
    docs = [d for d in re.split(r'(?m)^---\s*$', text) if d.strip()]
    for d in docs:
        crd = yaml_load(d)
        if crd.get("kind") != "CustomResourceDefinition":
            continue
        group = crd["spec"]["group"]
        kind = crd["spec"]["names"]["kind"].lower()
        for v in crd["spec"]["versions"]:
            schema = strictify(v["schema"]["openAPIV3Schema"])
            props = schema.setdefault("properties", {})
            props["apiVersion"] = {"type": "string", "enum": [f"{group}/{v['name']}"]}
            props["kind"] = {"type": "string", "enum": [crd["spec"]["names"]["kind"]]}
            props["metadata"] = {"type": "object"}
            dest = os.path.join(outdir, "crds", group)
            os.makedirs(dest, exist_ok=True)
            with open(os.path.join(dest, f"{kind}_{v['name']}.json"), "w") as f:
                json.dump(schema, f)


def yaml_load(text):
    # PyYAML is not in a bare Debian python3; the CRDs are converted with the
    # yaml module when present, else via `python3 -c` refusing clearly.
    try:
        import yaml  # noqa: PLC0415
    except ImportError:
        raise SystemExit("python3-yaml is required (scripts/apt-ensure.sh python3-yaml)")
    return yaml.safe_load(text)


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    wheel, outdir, version, crds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    h = hashlib.sha256()
    for p in [wheel] + crds:
        h.update(p.encode())
        with open(p, "rb") as f:
            h.update(f.read())
    stamp = os.path.join(outdir, ".done")
    if os.path.exists(stamp) and open(stamp).read() == h.hexdigest():
        return
    os.makedirs(outdir, exist_ok=True)
    if not os.path.isdir(os.path.join(outdir, f"v{version}-standalone-strict")) or not os.path.exists(stamp):
        convert_k8s(wheel, outdir, version)
    for c in crds:
        convert_crd(c, outdir)
    with open(stamp, "w") as f:
        f.write(h.hexdigest())


if __name__ == "__main__":
    main()
