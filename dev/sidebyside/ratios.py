"""Summarises dev/sidebyside/run.sh's raw files: per round and median over rounds, the ratio
best peer / crate (layer and mha_forward; > 1 means the crate is faster) and the crate's share
of the round's FMA peak (the peer kit's, at the best vector width); the medians over rounds of
the layer's time, the best peer's time, and mha_forward's time as a multiple of the layer's."""
import json
import statistics
import sys
from pathlib import Path

FLOPS = {  # useful FLOPs 8·B·T·D² + 2·B·D·T·(T+1), as the peer kit counts them
    name: 8 * b * t * d * d + 2 * b * d * t * (t + 1)
    for name, (b, t, d) in {
        "tiny": (1, 2, 4), "small": (1, 128, 256), "gpt2": (1, 1024, 768),
        "batch": (8, 256, 512), "long": (1, 4096, 512),
    }.items()
}


def peaks(path):
    """GFLOP/s per thread count, best width."""
    best = {}
    for line in path.read_text().splitlines()[1:]:
        width, threads, gflops, _ = line.split()
        best[int(threads)] = max(best.get(int(threads), 0.0), float(gflops))
    return best


def peers(path):
    """(shape, threads) -> (best median ms, peer name)."""
    best = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r["peer"] == "numpy":
            continue
        key = (r["shape"], r["threads"])
        if key not in best or r["median_ms"] < best[key][0]:
            best[key] = (r["median_ms"], r["peer"])
    return best


def crate(path):
    """(shape, threads) -> (layer median ms, mha_forward ms)."""
    rows = {}
    for line in path.read_text().splitlines():
        f = line.split()
        if len(f) >= 10 and f[0] in FLOPS and f[1].isdigit():
            rows[(f[0], int(f[1]))] = (float(f[2]), float(f[8]))
    return rows


def main(out, rounds):
    out = Path(out)
    table = {}
    for r in range(1, rounds + 1):
        peak = peaks(out / f"peak-{r}.txt")
        best = peers(out / f"peers-{r}.jsonl")
        for bench in sorted(out.glob(f"bench-{r}-*.txt")):
            for key, (layer, once) in crate(bench).items():
                if key not in best:
                    continue
                peer_ms, name = best[key]
                share = FLOPS[key[0]] / (layer * 1e-3) / 1e9 / peak[key[1]]
                table.setdefault(key, []).append(
                    (peer_ms / layer, peer_ms / once, share, name, layer, peer_ms, once / layer))
    print("| shape | threads | layer ms | best peer ms | layer ratio per round | median "
          "| mha_forward ratio per round | median | 1-shot / layer | % of FMA peak |")
    print("|---|---:|---:|---:|---|---:|---|---:|---:|---:|")
    for (shape, threads), rows in sorted(table.items(), key=lambda kv: (kv[0][1], list(FLOPS).index(kv[0][0]))):
        layer = [r[0] for r in rows]
        once = [r[1] for r in rows]
        med = lambda i: statistics.median(r[i] for r in rows)
        peer_names = sorted({r[3] for r in rows})
        fmt = lambda v: " ".join(f"{x:.2f}" for x in v)
        print(f"| {shape} | {threads} | {med(4):.4g} | {med(5):.4g} ({'/'.join(peer_names)}) "
              f"| {fmt(layer)} | **{med(0):.2f}×** | {fmt(once)} | {med(1):.2f}× "
              f"| {med(6):.2f}× | {100 * med(2):.1f} |")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
