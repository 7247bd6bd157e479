#!/usr/bin/env python3
"""Write a recorded report.json as a test fixture: compact, with each target's /proc timeline
thinned to at most 60 samples (the charts still have a line each; every other field is kept as
the lab wrote it). Usage: trim.py RUN_DIR/report.json > tests/data/NAME/report.json"""
import json
import sys

with open(sys.argv[1]) as f:
    rep = json.load(f)
for name, samples in (rep.get("timelines") or {}).items():
    if len(samples) > 60:
        step = -(-len(samples) // 60)
        rep["timelines"][name] = samples[::step]
json.dump(rep, sys.stdout, ensure_ascii=False, separators=(",", ":"))
sys.stdout.write("\n")
