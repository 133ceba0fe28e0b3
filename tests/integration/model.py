"""The integration tests' model and data: a student MLP learns a fixed random teacher (regression).
Small enough to train 100+ steps in seconds on emulated ranks, its weight gradients (64 KiB to 1 MiB
per layer) large enough to go FP8 at the tests' thresholds, and its loss falls by more than 10x, so
the loss curve has a shape to compare. Same initial weights on every rank; each rank its own shard
of the data; every tensor drawn on the CPU from seeded generators, so runs repeat exactly."""
import torch

IN, HIDDEN, OUT, BATCH = 64, 512, 16, 128


def make_model(seed=1234):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, OUT))


class Teacher:
    def __init__(self, device):
        g = torch.Generator().manual_seed(99)
        self.w1 = (torch.randn(IN, 128, generator=g) / IN ** 0.5).to(device)
        self.w2 = (torch.randn(128, OUT, generator=g) / 128 ** 0.5).to(device)

    def __call__(self, x):
        return torch.tanh(x.float() @ self.w1) @ self.w2


class Data:
    """Batches of rank `rank`'s shard, and the held-out set every rank evaluates on."""

    def __init__(self, rank, device):
        self.device = device
        self.teacher = Teacher(device)
        self.gen = torch.Generator().manual_seed(1000 + rank)

    def batch(self):
        x = torch.randn(BATCH, IN, generator=self.gen).to(self.device)
        return x, self.teacher(x)

    def held_out(self, n=2048):
        x = torch.randn(n, IN, generator=torch.Generator().manual_seed(7)).to(self.device)
        return x, self.teacher(x)


def mse(pred, target):
    return torch.nn.functional.mse_loss(pred.float(), target.float())


def train(net, opt, sched, data, steps):
    """`steps` eager optimiser steps on `data`'s batches; the loss of each."""
    losses = []
    for _ in range(steps):
        x, y = data.batch()
        loss = mse(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses
