"""Printing the benchmark results: the timing table with its geomean row, the compile-time table,
the tier-up table (speed before tier-up, seconds to full speed), the bandwidth table of the
memory-bound workloads, the peak-memory table, and the guard-overhead lines.

Input: the list of row dicts from benchmarks.measure (and the guard-overhead dict). Output: text on
stdout, and `summary(rows)`, the geomeans that also go into bench_results.json.
"""
from __future__ import annotations

from benchmarks.timing import geomean


def _ok(row: dict, compiler: str) -> bool:
    return row.get(compiler, {}).get("status") == "ok"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def summary(rows: list[dict]) -> dict:
    kiln = [r["kiln"]["speedup"] for r in rows if _ok(r, "kiln")]
    torch_ = [r["torch"]["speedup"] for r in rows if _ok(r, "torch")]
    both = [r for r in rows if _ok(r, "kiln") and _ok(r, "torch")]
    cold = [r for r in both if r["kiln"].get("cold_s") and r["torch"].get("cold_s")]
    warm = [r for r in both if r["kiln"].get("warm_s") and r["torch"].get("warm_s")]
    return {
        "kiln_speedup_geomean": geomean(kiln),
        "torch_speedup_geomean": geomean(torch_),
        "kiln_over_torch_geomean": geomean([r["kiln"]["speedup"] / r["torch"]["speedup"] for r in both]),
        "kiln_over_torch_cold_geomean": geomean([r["kiln"]["cold_s"] / r["torch"]["cold_s"] for r in cold]),
        "kiln_over_torch_warm_geomean": geomean([r["kiln"]["warm_s"] / r["torch"]["warm_s"] for r in warm]),
        "workloads_with_kiln": len(kiln),
        "workloads_with_torch": len(torch_),
        **tierup_summary(rows),
    }


def _tierup(row: dict, key: str) -> float | None:
    return row.get("tierup", {}).get(key)


def tierup_summary(rows: list[dict]) -> dict:
    """Geomeans of the tier-up table: Kiln's Python tier over eager and against torch.compile (the
    target is at least 1), and full-speed seconds over torch.compile's first call (at most 0.2)."""
    def values(key: str) -> list[float]:
        return [v for v in (_tierup(r, key) for r in rows) if v]

    return {
        "kiln_python_speedup_geomean": geomean(values("python_speedup")),
        "kiln_python_over_torch_geomean": geomean(values("python_over_torch")),
        "full_speed_over_torch_first_geomean": geomean(values("full_speed_over_torch_first")),
        "workloads_with_tierup": len(values("python_speedup")),
    }


def print_speed_table(rows: list[dict], totals: dict) -> None:
    print(f"{'workload':<20}{'eager ms':>10}{'kiln ms':>10}{'torch ms':>10}{'kiln x':>9}{'torch x':>9}{'kiln/torch':>12}")
    for r in rows:
        k, t = r.get("kiln", {}), r.get("torch", {})
        ratio = k["speedup"] / t["speedup"] if _ok(r, "kiln") and _ok(r, "torch") else None
        print(
            f"{r['name']:<20}{r['eager_ms']:>10.3f}{_num(k.get('ms'), '.3f'):>10}{_num(t.get('ms'), '.3f'):>10}"
            f"{_num(k.get('speedup'), '.2f'):>9}{_num(t.get('speedup'), '.2f'):>9}{_num(ratio, '.2f'):>12}"
        )
    print(
        f"{'geomean':<50}{_num(totals['kiln_speedup_geomean'], '.2f'):>9}"
        f"{_num(totals['torch_speedup_geomean'], '.2f'):>9}{_num(totals['kiln_over_torch_geomean'], '.2f'):>12}"
    )
    print("  (ms per call; 'x' = speedup over eager, higher is better; kiln/torch = ratio of the two speedups)")


def print_compile_table(rows: list[dict], totals: dict) -> None:
    print(
        f"{'workload':<20}{'kiln cold s':>12}{'torch cold s':>13}{'kiln warm s':>12}{'torch warm s':>13}"
        f"{'kiln graphs':>12}{'torch graphs':>13}{'kiln bg s':>10}{'kiln recomp':>12}{'kiln breaks':>12}"
        f"{'kiln fallbk':>12}{'torch breaks':>13}"
    )
    for r in rows:
        k, t = r.get("kiln", {}), r.get("torch", {})
        print(
            f"{r['name']:<20}{_num(k.get('cold_s'), '.2f'):>12}{_num(t.get('cold_s'), '.2f'):>13}"
            f"{_num(k.get('warm_s'), '.2f'):>12}{_num(t.get('warm_s'), '.2f'):>13}"
            f"{_num(k.get('compiles'), 'd'):>12}{_num(t.get('compiles'), 'd'):>13}{_num(k.get('tier_up_s'), '.1f'):>10}"
            f"{_count(k, 'recompiles'):>12}{_count(k, 'graph_breaks'):>12}{_count(k, 'fallbacks'):>12}"
            f"{_count(t, 'graph_breaks'):>13}"
        )
    print(
        f"{'geomean kiln/torch':<20}{_num(totals['kiln_over_torch_cold_geomean'], '.2f'):>12}{'':>13}"
        f"{_num(totals['kiln_over_torch_warm_geomean'], '.2f'):>12}"
    )
    print("  (cold: first step in a fresh process with an empty cache dir; warm: a second fresh process")
    print("   reusing that cache dir; includes importing the compiler and the first step's run;")
    print("   kiln bg s: seconds of native-wrapper builds for hot graphs, on a background thread, waited")
    print("   for before timing so that the speed tables show the steady state; graphs, recompiles, breaks and")
    print("   fallbacks (calls of a frame that ran eagerly) count every call this process made, not the first only)")


def print_tierup_table(rows: list[dict], totals: dict) -> None:
    print(f"{'workload':<22}{'kiln 1st s':>11}{'py ms':>9}{'py x':>7}{'py/torch':>10}{'full x':>8}{'full s':>8}"
          f"{'torch 1st s':>12}{'full/1st':>10}{'native':>8}")
    seeded = False
    for r in rows:
        t = r.get("tierup")
        if t is None:
            continue
        seeded |= bool(t.get("header_seeded"))
        wrappers = t.get("wrappers") or {}
        native = f"{wrappers['native']}/{wrappers['tiered']}" if wrappers else "-"
        print(f"{r['name']:<22}{_num(t.get('first_call_s'), '.2f'):>11}{_num(t.get('python_ms'), '.3f'):>9}"
              f"{_num(t.get('python_speedup'), '.2f'):>7}{_num(t.get('python_over_torch'), '.2f'):>10}"
              f"{_num(t.get('kiln_speedup'), '.2f'):>8}{_num(t.get('full_speed_s'), '.1f'):>8}"
              f"{_num(t.get('torch_first_call_s'), '.1f'):>12}{_num(t.get('full_speed_over_torch_first'), '.2f'):>10}"
              f"{native:>8}")
    print(f"{'geomean':<42}{_num(totals['kiln_python_speedup_geomean'], '.2f'):>7}"
          f"{_num(totals['kiln_python_over_torch_geomean'], '.2f'):>10}{'':>28}"
          f"{_num(totals['full_speed_over_torch_first_geomean'], '.2f'):>10}")
    print("  (kiln 1st s: import, compile and first step in a fresh process with empty caches; py ms, py x:")
    print("   Kiln's Python tier (calls 2 to the first that asks for a native build, at most 100): median ms")
    print("   of single steps, and its speedup over eager steps timed between them; py/torch: that speedup")
    print("   over torch.compile's (target >= 1); full x: Kiln's once every graph still called settled")
    print("   (medians of single steps in turn); full s: seconds from Kiln's import until then, the loop")
    print("   stepping all along; torch 1st s: torch.compile's first step from an empty cache; full/1st:")
    print("   target <= 0.2; native: graphs running their native wrapper / graphs with a tiered wrapper)")
    if seeded:
        print("   (--quick: each fresh cache got the precompiled header built once for the run, and torch.compile's")
        print("   speedup and first call come from the speed table and its cold start when measured; a full run's")
        print("   cold caches build their own header, counted in 'full s', and time torch.compile beside Kiln)")
    for r in rows:
        status = r.get("tierup", {}).get("status", "ok")
        if status != "ok":
            print(f"  {r['name']}: {status}")


def print_bandwidth_table(rows: list[dict], copy_gbs: float, copy_mib: int) -> None:
    print(f"machine copy bandwidth (copy_ of a {copy_mib} MiB tensor, read+write): {copy_gbs:.1f} GB/s")
    print(f"{'workload':<20}{'MB/call':>9}{'eager GB/s':>12}{'kiln GB/s':>11}{'torch GB/s':>12}{'best % of copy':>16}")
    for r in rows:
        if not r.get("bytes_moved"):
            continue
        mb = r["bytes_moved"] / 1e6

        def gbs(ms: float | None) -> float | None:
            return None if ms is None else r["bytes_moved"] / (ms * 1e-3) / 1e9

        values = [gbs(r["eager_ms"]), gbs(r.get("kiln", {}).get("ms")), gbs(r.get("torch", {}).get("ms"))]
        best = max(v for v in values if v is not None)
        r["bandwidth_gbs"] = dict(zip(("eager", "kiln", "torch"), values))
        print(
            f"{r['name']:<20}{mb:>9.1f}{_num(values[0], '.1f'):>12}{_num(values[1], '.1f'):>11}"
            f"{_num(values[2], '.1f'):>12}{100 * best / copy_gbs:>15.0f}%"
        )
    print("  (bytes moved = inputs read once + outputs written once, the minimum any kernel must move)")


def _count(part: dict, key: str) -> str:
    return _num((part.get("counts") or {}).get(key), "d")


def _mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.2f}"


def print_memory_table(rows: list[dict]) -> None:
    print(f"{'workload':<20}{'eager MiB':>11}{'kiln MiB':>10}{'torch MiB':>11}{'kiln/torch':>12}")
    for r in rows:
        k, t = r.get("kiln", {}).get("peak_bytes"), r.get("torch", {}).get("peak_bytes")
        ratio = k / t if k and t else None
        print(f"{r['name']:<20}{_mib(r.get('eager_peak_bytes')):>11}{_mib(k):>10}{_mib(t):>11}{_num(ratio, '.2f'):>12}")
    print("  (peak tensor memory of one step above what was live before it: every allocation and free of")
    print("   PyTorch's CPU allocator, from the profiler with profile_memory=True; BLAS and OpenMP scratch")
    print("   and Python objects are not counted; a free counts only for a block allocated in the same profile)")


def print_notes(rows: list[dict], kiln_unavailable: str | None) -> None:
    """Every status other than ok (failed, wrong result, not compiled) and every note, per workload."""
    lines = []
    for r in rows:
        for compiler in ("kiln", "torch"):
            part = r.get(compiler, {})
            if compiler == "kiln" and kiln_unavailable is not None:
                continue  # said once for the whole run
            if part.get("status", "ok") != "ok":
                lines.append(f"{r['name']} / {compiler}: {part['status']}")
            lines.extend(f"{r['name']} / {compiler}: {note}" for note in part.get("notes", []))
    if lines:
        print("\n== notes ==")
        print("\n".join(lines))


def print_guard_overhead(result: dict) -> None:
    print(f"uncompiled call of add_mul(x, y): {result['eager_call_us']:.2f} us")
    for system in ("kiln", "torch"):
        part = result.get(system, {})
        if "overhead_us" not in part:
            print(f"{system:<6} {part.get('status', 'not measured')}")
            continue
        print(
            f"{system:<6} cached compiled call {part['compiled_call_us']:7.2f} us, graph.forward called directly "
            f"{part['graph_call_us']:6.2f} us -> overhead {part['overhead_us']:6.2f} us"
        )
    print("  (target: Kiln's overhead under 10 us)")
