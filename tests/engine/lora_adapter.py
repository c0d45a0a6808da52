"""Builds a random LoRA adapter for a tiny checkpoint of the real-engine suite, offline, in peft's format.

peft is not needed: an adapter is `adapter_config.json` (peft's LoraConfig fields) and
`adapter_model.safetensors` with peft's tensor names, `base_model.model.<module>.lora_A.weight` [r, in] and
`lora_B.weight` [out, r]. The modules are the text layers' `q_proj` and `v_proj`, which vLLM's Qwen2.5-VL
LoRA support takes (its `packed_modules_mapping` packs them into `qkv_proj`); the shapes are read from the
checkpoint's own weights. Values are random (fixed seed) and large enough that the adapter changes the
answers: the suite checks routing and cache keys, not text.

usage: lora_adapter.py CHECKPOINT_DIR OUT_DIR [RANK]
"""
import json
import os
import shutil
import sys

TARGETS = ("q_proj", "v_proj")


def main():
    checkpoint, out = sys.argv[1], sys.argv[2]
    rank = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    torch.manual_seed(1)
    tensors = {}
    with safe_open(os.path.join(checkpoint, "model.safetensors"), "pt") as f:
        for name in sorted(f.keys()):
            module = name.removesuffix(".weight")
            if "visual" in name or not name.endswith(".weight") or module.rsplit(".", 1)[-1] not in TARGETS:
                continue
            out_features, in_features = f.get_slice(name).get_shape()
            prefix = f"base_model.model.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_features) * 0.1
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, rank) * 0.1
    if not tensors:
        sys.exit(f"no {TARGETS} weights in {checkpoint}")
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": checkpoint,
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": list(TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
    }
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    with open(os.path.join(tmp, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(tmp, "adapter_model.safetensors"))
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    print(f"lora adapter: rank {rank}, {len(tensors)} tensors on {TARGETS} in {out}")


if __name__ == "__main__":
    main()
