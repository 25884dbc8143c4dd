#!/usr/bin/env python3
"""fp8-quality.py TOLERANCE SVG REFERENCE_DIR RUN_DIR...: the validation losses of runs'
log.jsonl side by side, step by step, and each run's final validation loss against the
reference's: prints the table and the relative differences, writes the curves as SVG (hand
drawn: no plotting library) unless SVG is "-", and exits 1 if a run has no validation loss at
the reference's last evaluation or ends more than TOLERANCE (relative) from it. Each
directory's name is its label. Python's standard library only."""
import json
import os
import sys


def val_losses(run_dir):
    losses = {}
    for line in open(os.path.join(run_dir, "log.jsonl")):
        record = json.loads(line)
        if record["event"] == "eval":
            losses[record["step"]] = record["val_loss"]
    return losses


COLOURS = ["#222222", "#d62728", "#1f77b4", "#2ca02c", "#9467bd"]


def svg(curves, path):
    """The curves (label -> {step: loss}) on one chart, 640 x 400, the loss axis from the
    lowest loss to the highest after the first evaluation (step 0's is off the scale)."""
    width, height, left, right, top, bottom = 640, 400, 60, 150, 20, 40
    steps = sorted({s for c in curves.values() for s in c})
    shown = [v for c in curves.values() for s, v in c.items() if s >= steps[min(1, len(steps) - 1)]]
    lo, hi = min(shown), max(shown)
    pad = (hi - lo) * 0.05 or 0.01
    lo, hi = lo - pad, hi + pad
    x = lambda s: left + (width - left - right) * (s - steps[0]) / max(steps[-1] - steps[0], 1)
    y = lambda v: top + (height - top - bottom) * (hi - min(max(v, lo), hi)) / (hi - lo)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>',
           f'<text x="{(left + width - right) / 2}" y="{height - 8}" text-anchor="middle">step</text>',
           f'<text x="14" y="{(top + height - bottom) / 2}" text-anchor="middle" transform="rotate(-90 14 {(top + height - bottom) / 2})">validation loss</text>']
    for i in range(6):
        v = lo + (hi - lo) * i / 5
        out.append(f'<line x1="{left - 4}" y1="{y(v):.1f}" x2="{width - right}" y2="{y(v):.1f}" stroke="#dddddd"/>')
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.3f}</text>')
    for s in sorted(set(steps[:: max(1, len(steps) // 10)] + [steps[-1]])):
        out.append(f'<text x="{x(s):.1f}" y="{height - bottom + 16}" text-anchor="middle">{s}</text>')
    for i, (label, curve) in enumerate(curves.items()):
        colour = COLOURS[i % len(COLOURS)]
        points = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in sorted(curve.items()))
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        out.append(f'<line x1="{width - right + 10}" y1="{top + 10 + 18 * i}" x2="{width - right + 30}" y2="{top + 10 + 18 * i}" stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{width - right + 36}" y="{top + 14 + 18 * i}">{label}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    if len(sys.argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    tolerance, svg_path, dirs = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
    curves = {os.path.basename(os.path.normpath(d)): val_losses(d) for d in dirs}
    labels = list(curves)
    reference = curves[labels[0]]
    if not reference:
        print(f"{dirs[0]}: no validation loss in log.jsonl", file=sys.stderr)
        return 1
    print(f"validation loss by step ({', '.join(labels[1:])} against {labels[0]})")
    print(f"{'step':>6}" + "".join(f"{label:>16}" for label in labels))
    for step in sorted(reference):
        print(f"{step:>6}" + "".join(f"{curves[label][step]:>16.5f}" if step in curves[label] else f"{'-':>16}" for label in labels))
    last = max(reference)
    failures = 0
    print(f"final (step {last}), relative to {labels[0]} = {reference[last]:.5f}:")
    for label in labels[1:]:
        loss = curves[label].get(last)
        if loss is None:
            print(f"  {label}: no validation loss at step {last}: FAIL")
            failures += 1
            continue
        relative = (loss - reference[last]) / reference[last]
        verdict = "ok" if abs(relative) <= tolerance else "FAIL"
        failures += verdict != "ok"
        print(f"  {label}: {loss:.5f} ({100 * relative:+.3f}%, limit {100 * tolerance:g}%): {verdict}")
    if svg_path != "-":
        svg(curves, svg_path)
        print(f"curves: {svg_path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
