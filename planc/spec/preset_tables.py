"""The model and device presets as markdown tables: ``planc presets`` prints them, and
``tools/language_tables.py`` pastes them into docs/language.md (one definition for both)."""

from __future__ import annotations

from planc.spec.build import build_plan
from planc.spec.presets import HARDWARE_PRESETS, MODEL_PRESETS
from planc.spec.presets.hardware import NOMINAL_MEMORY


def model_preset_table() -> str:
    rows = [
        "| preset | layers | hidden | heads | kv_heads | ffn | vocab | seq_len | mlp / norm / position | "
        "tied | parameters |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in MODEL_PRESETS:
        m = build_plan({"model": {"preset": name}, "hardware": {"device": "cpu"}, "train": {"global_batch": 1}}).model
        rows.append(
            f"| `{name}` | {m.layers} | {m.hidden} | {m.heads} | {m.kv_heads} | {m.ffn} | {m.vocab} | "
            f"{m.seq_len} | {m.mlp} / {m.norm} / {m.position} | {'yes' if m.tie_embeddings else 'no'} | "
            f"{m.params:,} |"
        )
    return "\n".join(rows)


def device_preset_table() -> str:
    rows = [
        "| device | memory (reported) | nominal | peak (bf16) | peak_fp32 | hbm_bw | intra_node_bw | inter_node_bw | "
        "per_node | efficiency | link shares (intra / inter) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, p in HARDWARE_PRESETS.items():
        memory = f"{p['memory'] / 2**30:.4g} GiB"
        nominal = f"{NOMINAL_MEMORY[name] / 1e9:g} GB" if name in NOMINAL_MEMORY else "—"
        rows.append(
            f"| `{name}` | {memory} | {nominal} | {p['peak'] / 1e12:g} TFLOPS | {p['peak_fp32'] / 1e12:g} TFLOPS | "
            f"{p['hbm_bw'] / 1e9:g} GB/s | {p['intra_node_bw'] / 1e9:g} GB/s | "
            f"{p['inter_node_bw'] / 1e9:g} GB/s | {p['per_node']} | {p['efficiency']} | "
            f"{p['intra_node_link_efficiency']:g} / {p['inter_node_link_efficiency']:g} |"
        )
    return "\n".join(rows)
