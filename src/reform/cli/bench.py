"""``reform bench``: time, peak memory and FLOP efficiency of methods on the same needle inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .eval import MethodsOpt, check_load, check_methods, load
from .common import CliError, DeviceOpt, DtypeOpt, ModelOpt, app, checked_output, err, fail, notes_as_lines, out


def scaling_lengths(text: str) -> list[int]:
    """``"8k..1M"``: every power-of-two multiple of the first length up to the last."""
    from ..eval.specs import parse_length
    lo, sep, hi = text.partition("..")
    if not sep:
        raise ValueError(f"bad --scaling '{text}': use FROM..TO, e.g. 8k..1M")
    a, b = parse_length(lo), parse_length(hi)
    if b <= a:
        raise ValueError(f"bad --scaling '{text}': TO must be larger than FROM")
    lengths = [a]
    while lengths[-1] * 2 <= b:
        lengths.append(lengths[-1] * 2)
    return lengths


def table(result: dict) -> str:
    """Markdown table of the summary (medians)."""
    from ..eval.specs import format_length
    head = ("| method | length | tokens | correct | wall s | encode s | recompute s | TTFT s | TPOT s | tok/s "
            "| 2nd question s | RSS at start MB | peak RSS MB | FLOP eff. (encode) | bytes/token kept |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in sorted(result["summary"], key=lambda r: (r["input_tokens"], r["method"])):
        tpot = r.get("tpot_s_median")
        lines.append(
            f"| {r['method']} | {format_length(r['length'])} | {r['input_tokens']} | {r['correct']:.0%} "
            f"| {r['wall_s_median']:.2f} | {r['encode_s_median']:.2f} | {r['recompute_s_median']:.2f} "
            f"| {r['ttft_s_median']:.2f} | {'—' if tpot is None else f'{tpot:.3f}'} | {r['tokens_per_s_median']:.0f} "
            f"| {r['second_question_s_median']:.2f} | {r.get('rss_start_mb_median') or 0:.0f} | {r['peak_rss_mb_median']:.0f} "
            f"| {r['flop_efficiency_median']:.1%} ({r.get('encode_flop_efficiency_median') or 0:.1%}) "
            f"| {r['bytes_per_input_token']:.0f} |")
    return "\n".join(lines)


def gguf_file(model: str | None) -> Path | None:
    """The GGUF file a peer runtime can load for ``--model``, or None."""
    from ..model import DEFAULT_MODEL, PACKAGED, packaged_path
    if not model or model in PACKAGED:
        return packaged_path(model or DEFAULT_MODEL)
    return Path(model).expanduser() if model.endswith(".gguf") else None


def peer_table(result: dict) -> str:
    """Our encode next to the peer's prompt processing, in tokens per second per layer run."""
    from ..eval.specs import format_length
    lines = ["| length | runtime | weights | tokens | tokens/s | layers run | tokens/s x layers |", "|---|---|---|---|---|---|---|"]
    for length in result["lengths"]:
        for r in (r for r in result["summary"] if r["length"] == length):
            per_s = r["input_tokens"] / r["encode_s_median"]
            lines.append(f"| {format_length(length)} | reform: {r['method']} encode | {result['machine']['matmul_dtype']} "
                         f"| {r['input_tokens']} | {per_s:.0f} | {r['encode_layers']:.2f} | {per_s * r['encode_layers']:.0f} |")
        for p in (p for p in result["peer"] if p["length"] == length):
            if "error" in p:
                lines.append(f"| {format_length(length)} | {p['peer']} | {p.get('weights', '—')} | — | — | — | {p['error']} |")
            else:
                lines.append(f"| {format_length(length)} | {p['peer']} prompt | {p['weights']} ({p['gguf']}) | {p['tokens']} "
                             f"| {p['tokens_per_s']:.0f} | {p['layers']} | {p['tokens_per_s_per_layer']:.0f} |")
    return "\n".join(lines)


@app.command()
def bench(methods: str = MethodsOpt,
          lengths: Optional[str] = typer.Option(None, "--lengths", help="comma-separated input lengths, e.g. 32k,128k"),
          scaling: Optional[str] = typer.Option(None, "--scaling", help="FROM..TO: doubling lengths (e.g. 8k..1M); "
                                                "prints the fitted exponent of time vs length"),
          repeats: int = typer.Option(1, "--repeats", min=1, help="runs per method and length (min/median reported)"),
          max_new_tokens: int = typer.Option(16, "--max-new-tokens", min=1),
          seed: int = typer.Option(0, "--seed"),
          profile: bool = typer.Option(False, "--profile", help="also profile one extra run per method and length "
                                       "(torch profiler; top operators to profile-METHOD-LENGTH.txt)"),
          peer: Optional[str] = typer.Option(None, "--peer", help="also time this runtime's prompt processing of "
                                             "the same tokens, per layer: llama.cpp (needs llama-cpp-python and "
                                             "a .gguf model; pip install -e \".[peer]\")"),
          out_dir: Path = typer.Option(Path("runs/bench"), "--out", "-o", help="folder for bench.json and PNGs"),
          model: Optional[str] = ModelOpt, device: Optional[str] = DeviceOpt, dtype: Optional[str] = DtypeOpt):
    """Time every method on the same NIAH-style input at each length: stages, TTFT/TPOT, tokens/s, peak
    memory, FLOP efficiency against this machine's measured matmul throughput, and a second question on
    the encoded context. Writes bench.json, bench.md and PNGs to --out."""
    from ..eval.specs import parse_lengths
    from ..outputs import write_atomic
    try:
        if (lengths is None) == (scaling is None):
            raise CliError("give exactly one of --lengths (e.g. 32k,128k) or --scaling (e.g. 8k..1M)")
        try:
            sizes = parse_lengths(lengths) if lengths is not None else scaling_lengths(scaling)
        except ValueError as e:
            raise CliError(str(e)) from None
        specs = check_methods(methods)
        from ..bench.peer import PEERS
        if peer is not None and peer not in PEERS:
            raise CliError(f"unknown --peer '{peer}': use {', '.join(PEERS)}")
        check_load(model, device, dtype)
        out_dir = checked_output(out_dir, "--out", folder=True)
        loaded = load(model, device, dtype)
        from ..bench.runner import run_bench
        try:
            with notes_as_lines():
                result = run_bench(specs, sizes, loaded=loaded, out_dir=out_dir, repeats=repeats,
                                   max_new_tokens=max_new_tokens, seed=seed, profile=profile,
                                   peer=peer, peer_gguf=gguf_file(model) if peer else None,
                                   progress=lambda s: err.print(s, markup=False))
        except ValueError as e:
            raise CliError(str(e)) from None
    except CliError as e:
        fail(e)
    md = table(result)
    if result["peer"]:
        md += "\n\n" + peer_table(result)
    for fit in result["scaling"]:
        md += (f"\n\n{fit['method']}: time ~ length^{fit['time_exponent']} over {fit['points']} lengths; "
               f"peak RSS grows {fit['rss_bytes_per_token']:.0f} bytes per extra input token")
    write_atomic(out_dir / "bench.md", md + "\n")
    out.print(md, markup=False)
    out.print(f"\nwrote {out_dir / 'bench.json'}, {out_dir / 'bench.md'} and PNGs", markup=False)
