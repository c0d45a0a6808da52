"""Builds a tiny random-weight checkpoint of a bundled profile, offline, for the real-engine suite.

The checkpoint keeps what decides prompt tokens and cache keys -- the profile's real tokenizer, chat
template, image processor, vocab size, patch/merge/temporal sizes and special-token ids -- and shrinks
everything else (2 text layers of width 128, a 2-block vision tower), so vLLM's CPU build serves it in
seconds per chat. Weights are random (fixed seed): the answers are nonsense, the prompt is the real one.

usage: checkpoint.py PROFILE OUT_DIR   (PROFILE: qwen2.5-vl | qwen3-vl, read from config/models/)
"""
import gzip
import json
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "config", "models")
# Qwen2.5-VL's real tokenizer lacks Qwen3's last four added tokens (see config/models/README.md).
QWEN25_MISSING = {"<tool_response>", "</tool_response>", "<think>", "</think>"}

TINY_TEXT = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, max_window_layers=2)
TINY_VISION = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128)


def tiny_config(profile, real):
    cfg = json.loads(json.dumps(real))
    if profile == "qwen2.5-vl":
        cfg.update(TINY_TEXT)
        cfg["rope_scaling"] = {"type": "mrope", "mrope_section": [8, 12, 12]}  # head_dim 64 / 2
        cfg["vision_config"].update(TINY_VISION, fullatt_block_indexes=[1])
    elif profile == "qwen3-vl":
        cfg["text_config"].update(TINY_TEXT, head_dim=64)
        cfg["text_config"]["rope_scaling"]["mrope_section"] = [12, 10, 10]
        cfg["vision_config"].update(TINY_VISION, deepstack_visual_indexes=[1])
    else:
        sys.exit(f"unknown profile {profile}")
    return cfg


def tokenizer_json(profile):
    with gzip.open(os.path.join(MODELS, "qwen-tokenizer.json.gz"), "rt", encoding="utf-8") as f:
        tok = json.load(f)
    if profile == "qwen2.5-vl":
        tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] not in QWEN25_MISSING]
    return tok


def main():
    profile, out = sys.argv[1], sys.argv[2]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    src = os.path.join(MODELS, profile)
    real = json.load(open(os.path.join(src, "config.json")))
    cfg_dict = tiny_config(profile, real)
    arch = cfg_dict["architectures"][0]
    config_cls = transformers.AutoConfig.for_model(cfg_dict["model_type"]).__class__
    config = config_cls.from_dict(cfg_dict)
    torch.manual_seed(0)
    model = getattr(transformers, arch)(config).to(torch.bfloat16)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for name in ("preprocessor_config.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, name), os.path.join(tmp, name))
    with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(profile), f, ensure_ascii=False)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    n = sum(p.numel() for p in model.parameters())
    print(f"checkpoint {profile}: {n / 1e6:.1f} M parameters in {out}")


if __name__ == "__main__":
    main()
