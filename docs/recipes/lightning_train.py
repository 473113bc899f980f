"""Train with PyTorch Lightning on dalistream batches, on every rank of a DDP job.

The loader is built in the DataModule's ``train_dataloader`` hook: Lightning calls it after it has
started the process group, so the stream sees this process's rank and the world size. The Loader
is used as it is (no DataLoader around it, no sampler): every rank yields the same number of
batches, computed from the shards' counts, so DDP's collectives never wait on a rank that ran
out.

    python lightning_train.py --data data --devices 2            # 2 processes on this machine
    python lightning_train.py --data s3://bucket/train/ --accelerator gpu --devices 8 --num-nodes 4
"""
# run: python {recipe} --data data --devices 2 --epochs 2

import argparse

import lightning as L
import torch

from dalistream.pipelines import classification_train


class Classifier(L.LightningModule):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(),
                                       torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, classes))
        self.steps = 0

    def training_step(self, batch, batch_idx):
        out, labels = self.net(batch["image"]), batch["label"]
        # an empty batch (exact's last step, or samples all skipped): a zero loss, not NaN, and the
        # step still runs, so every rank joins the gradient all-reduce (docs/guide/training.md)
        loss = torch.nn.functional.cross_entropy(out, labels) if len(labels) else out.sum() * 0.0
        self.steps += 1
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Shards(L.LightningDataModule):
    def __init__(self, source: str, batch_size: int) -> None:
        super().__init__()
        self.source, self.batch_size, self.loader = source, batch_size, None

    def train_dataloader(self):
        # Called once the process group is up: rank and world size come from torch.distributed.
        # The images come out where DALI decoded them (the GPU when there is one).
        self.loader = classification_train.loader(self.source, batch_size=self.batch_size, size=32, workers=1,
                                                  seed=0)
        return self.loader

    def teardown(self, stage: str) -> None:
        if self.loader is not None:
            self.loader.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="data", help="shards: a folder, a pattern, s3://…")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1)
    args = parser.parse_args()

    model = Classifier()
    trainer = L.Trainer(accelerator=args.accelerator, devices=args.devices, num_nodes=args.num_nodes,
                        strategy="ddp" if args.devices * args.num_nodes > 1 else "auto", max_epochs=args.epochs,
                        use_distributed_sampler=False,  # dalistream splits the data itself
                        logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(model, datamodule=Shards(args.data, args.batch_size))
    print(f"rank {trainer.global_rank}: {model.steps} steps", flush=True)


if __name__ == "__main__":
    main()
