"""Train with Hugging Face Accelerate on dalistream batches, on every rank of a distributed job.

``Accelerator()`` starts the process group, so the stream opened after it sees this process's
rank and the world size. Only the model and the optimizer go through ``accelerator.prepare``: the
Loader already yields this rank's batches (the same number on every rank, computed from the
shards' counts), on the device DALI decoded them to.

    torchrun --nproc-per-node 2 accelerate_train.py --data data        # 2 processes, CPU (gloo)
    accelerate launch --multi_gpu --num_processes 8 accelerate_train.py --data s3://bucket/train/
"""
# run: torchrun --nproc-per-node 2 {recipe} --data data --epochs 2

import argparse

import torch
from accelerate import Accelerator

from dalistream.pipelines import classification_train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="data", help="shards: a folder, a pattern, s3://…")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(16, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)

    steps = 0
    device = "gpu" if accelerator.device.type == "cuda" else "cpu"
    with classification_train.loader(args.data, batch_size=args.batch_size, size=32, workers=1, seed=0,
                                     device=device, progress=True) as loader:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                out, labels = model(batch["image"]), batch["label"]
                # an empty batch: a zero loss, not NaN; every rank still joins the all-reduce
                loss = torch.nn.functional.cross_entropy(out, labels) if len(labels) else out.sum() * 0.0
                optimizer.zero_grad()
                accelerator.backward(loss)
                optimizer.step()
                steps += 1
        accelerator.print(loader.summary())
    print(f"rank {accelerator.process_index}: {steps} steps", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
