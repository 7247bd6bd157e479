#!/usr/bin/env python3
"""Check the Dockerfile for the properties the deployment relies on (Docker itself cannot run on
the build machines, so the image is not built by the checks; see docs/operations.md#deploying-container-image-helm-chart-dashboard).
It is parsed by Docker's own parser (PyPI `dockerfile`); scripts/check-deploy runs this with the
Python of its tools venv, where that package is installed.

- multi-stage: a `rust:1-bookworm` builder running `cargo build --release -p fanout --locked`,
  and a runtime stage (debian:bookworm-slim or distroless/cc) that copies the binary from it;
- the runtime stage runs as a non-root USER (numeric uid, not 0);
- EXPOSE of the client (8080) and admin (9901) ports;
- ENTRYPOINT in exec form: `fanout serve --config /etc/fanout/fanout.yaml`;
- .dockerignore keeps target/ and .git out of the build context.

    check-dockerfile.py Dockerfile .dockerignore           # exit 1 listing what is wrong
    check-dockerfile.py --self-test Dockerfile .dockerignore

--self-test breaks the Dockerfile in several ways and fails unless each is caught.
"""

import json
import re
import sys

import dockerfile

ENTRYPOINT = ["fanout", "serve", "--config", "/etc/fanout/fanout.yaml"]


KNOWN = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
         "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL", "MAINTAINER"}


def stages(text):
    """Stages as (image, name, [(INSTRUCTION, flags, values, exec_form)]), parsed by Docker's
    own parser (PyPI `dockerfile`, BuildKit's Go parser)."""
    result = []
    for c in dockerfile.parse_string(text):
        cmd = c.cmd.upper()
        if cmd not in KNOWN:
            raise ValueError(f"line {c.start_line}: unknown instruction {c.cmd}")
        if cmd == "FROM":
            v = list(c.value)
            name = v[2] if len(v) >= 3 and v[1].upper() == "AS" else None
            result.append((v[0], name, []))
        elif result:
            result[-1][2].append((cmd, list(c.flags), list(c.value), c.json))
    return result


def check(text, dockerignore):
    problems = []
    try:
        st = stages(text)
    except (ValueError, dockerfile.GoParseError) as e:
        return [f"does not parse: {e}"]
    if len(st) < 2:
        return [f"not multi-stage: {len(st)} stage(s)"]
    builders = [s for s in st[:-1] if s[0] == "rust:1-bookworm"]
    if not builders:
        problems.append("no rust:1-bookworm builder stage")
    build_runs = [" ".join(v) for s in builders for w, _, v, _ in s[2] if w == "RUN"]
    if not any(re.search(r"cargo build --release -p fanout --locked\b", r) for r in build_runs):
        problems.append("the builder does not run `cargo build --release -p fanout --locked`")
    image, _, final = st[-1]
    if not (image.startswith("debian:bookworm-slim") or image.startswith("gcr.io/distroless/cc")):
        problems.append(f"the runtime stage is {image}, not debian:bookworm-slim or distroless/cc")
    names = {s[1] for s in builders if s[1]}
    sources = [f.split("=", 1)[1] for w, flags, _, _ in final if w == "COPY" for f in flags
               if f.startswith("--from=")]
    if not any(s in names for s in sources):
        problems.append("the runtime stage copies nothing from the builder")
    users = [v[0] for w, _, v, _ in final if w == "USER"]
    if not users:
        problems.append("the runtime stage has no USER (it would run as root)")
    else:
        user = users[-1].split(":")[0]
        if user in ("0", "root") or not user.isdigit():
            problems.append(f"USER {users[-1]}: must be a numeric non-root uid (runAsNonRoot)")
    exposed = {p.split("/")[0] for w, _, v, _ in final if w == "EXPOSE" for p in v}
    for port in ("8080", "9901"):
        if port not in exposed:
            problems.append(f"port {port} is not EXPOSEd")
    entry = [(v, exec_form) for w, _, v, exec_form in final if w == "ENTRYPOINT"]
    form = entry[-1][0] if entry and entry[-1][1] else None
    if form is None or form[-len(ENTRYPOINT):] != ENTRYPOINT or not form[0].endswith("fanout"):
        problems.append(f"ENTRYPOINT must be the exec form {json.dumps(ENTRYPOINT)}, got {entry}")
    ignored = {l.strip().strip("/") for l in dockerignore.splitlines()
               if l.strip() and not l.startswith("#")}
    for path in ("target", ".git"):
        if path not in ignored:
            problems.append(f".dockerignore does not exclude {path}")
    return problems


def self_test(text, dockerignore):
    breakages = {
        "single stage": lambda d, i: re.sub(r"(?s)^.*?FROM debian", "FROM debian", d),
        "runs as root": lambda d, i: d.replace("USER 10001:10001", "USER root"),
        "no USER": lambda d, i: re.sub(r"(?m)^USER .*$", "", d),
        "build without --locked": lambda d, i: d.replace(" --locked", ""),
        "shell-form entrypoint": lambda d, i: re.sub(
            r"(?m)^ENTRYPOINT .*$", "ENTRYPOINT fanout serve --config /etc/fanout/fanout.yaml", d),
        "admin port not exposed": lambda d, i: re.sub(r"(?m)^EXPOSE .*$", "EXPOSE 8080", d),
        "target/ in the build context": None,
        "a typo in an instruction": lambda d, i: d.replace("EXPOSE", "EXPOS"),
    }
    base = check(text, dockerignore)
    if base:
        print("the Dockerfile already has problems: " + "; ".join(base), file=sys.stderr)
        return 1
    missed = []
    for name, f in breakages.items():
        d, i = text, dockerignore
        if f is None:
            i = "\n".join(l for l in i.splitlines() if l.strip() != "target")
        else:
            d = f(d, i)
        problems = check(d, i)
        print(f"  {'caught' if problems else 'MISSED'}: {name}" + (f" ({problems[0]})" if problems else ""))
        if not problems:
            missed.append(name)
    return 1 if missed else 0


def main(argv):
    selftest = "--self-test" in argv
    paths = [a for a in argv if a != "--self-test"]
    if len(paths) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(paths[0], encoding="utf-8") as f:
        text = f.read()
    with open(paths[1], encoding="utf-8") as f:
        dockerignore = f.read()
    if selftest:
        return self_test(text, dockerignore)
    problems = check(text, dockerignore)
    for p in problems:
        print(f"{paths[0]}: {p}", file=sys.stderr)
    if not problems:
        print("  ok: multi-stage, non-root USER, ports 8080/9901, exec-form ENTRYPOINT")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
