"""What ``nmtkit prepare`` tells a person: the summary table of a prepared directory's manifest
(pairs and tokens per split, what the cleaning dropped, per corpus too, the vocabulary, unknown
pieces, which steps ran)."""
from __future__ import annotations

from pathlib import Path


def print_summary(console, manifest: dict, status: dict, out: Path) -> None:
    """The manifest as a table on ``console`` (hidden by -q), then corpus, vocab, unknown-piece and step lines."""
    from rich.table import Table

    cleaning = manifest["cleaning"]
    table = Table(title=f"prepared {out}", title_justify="left")
    for column in ("", "pairs", "src tokens", "tgt tokens"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row("train read", f"{cleaning['read']:,}", "", "")
    dedup = manifest.get("settings", {}).get("data", {}).get("clean", {}).get("dedup", True)
    for rule, count in cleaning["dropped"].items():
        unchecked = rule in ("duplicate", "heldout") and dedup is False  # a 0 would read as "none found"
        table.add_row(f"  dropped: {rule}", "not checked (clean.dedup=false)" if unchecked else f"{count:,}", "", "")
    for split, info in manifest["splits"].items():  # train, dev, test
        tokens = manifest["tokens"][split]
        table.add_row(split, f"{info['pairs']:,}", f"{tokens['src']:,}", f"{tokens['tgt']:,}")
    console.info(table)
    for corpus in manifest.get("corpora", []):
        dropped_text = counts_text({rule: count for rule, count in corpus["dropped"].items() if count}) or "none"
        console.info(f"corpus {corpus['name']}" + (f" (tag {corpus['tag']})" if corpus["tag"] else "") +
                     f": read {corpus['read']:,}, kept {corpus['kept']:,}; dropped: {dropped_text}")
    dropped = {reason: count for reason, count in manifest["provenance"].get("dropped_verses", {}).items() if count}
    if dropped:
        console.info("verses not paired: " + counts_text(dropped))
    vocab = manifest["vocab"]
    sizes = vocab["size"]
    size_text = f"{sizes['src']:,}" if vocab["joint"] else f"{sizes['src']:,} src / {sizes['tgt']:,} tgt"
    fallback = {True: ", byte fallback", False: ", no byte fallback"}.get(vocab.get("byte_fallback"), "")
    console.info(f"vocab: {vocab['type']}, {'joint' if vocab['joint'] else 'separate'}, {size_text} pieces{fallback}" +
                 (f" (reused from {vocab['from']})" if "from" in vocab else ""))
    unknown = manifest.get("unknown", {})
    if unknown:  # every split, zeros too: "none unknown" is worth knowing for a new script
        console.info("unknown pieces (<unk>): " + ", ".join(
            f"{split} {sides['src']:,} src / {sides['tgt']:,} tgt" for split, sides in unknown.items()))
    console.info("steps: " + ", ".join(f"{name} {state}" for name, state in status.items()))


def counts_text(counts: dict) -> str:
    """``{"a": 1200, "b": 3}`` as "a 1,200, b 3"."""
    return ", ".join(f"{name} {count:,}" for name, count in counts.items())
