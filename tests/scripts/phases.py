"""A training loop whose forward, backward and optimizer step have known, different costs
(sleeps inside a custom autograd function and a custom optimizer: wall time that a busy
box stretches little, where a spin is stretched by every preemption), for the phase tests:
no monitor imports. `--nested`: the model holds 50 layers (its root alone is timed);
`--plain-optimizer`: the step is a plain function, not a torch optimizer; `--save PATH`:
the whole model saved (torch.save) and deep-copied after each epoch, then loaded back;
`--transform-ms MS`: each sample goes through an nn.Module transform costing MS, called
by the dataset (at 0 workers: on the training thread, inside next(loader)), as
torchvision's transforms are."""
import argparse
import copy
import time

import torch
from torch.utils.data import DataLoader, TensorDataset


def spin(s: float) -> None:
    time.sleep(s)  # sleep-ok: the modelled cost of a phase


class Costly(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fwd_s, bwd_s):
        ctx.bwd_s = bwd_s
        spin(fwd_s)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        spin(ctx.bwd_s)
        return grad * 2, None, None


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        return x * self.w


class Model(torch.nn.Module):
    def __init__(self, fwd_s, bwd_s, layers):
        super().__init__()
        self.fwd_s, self.bwd_s = fwd_s, bwd_s
        self.layers = torch.nn.ModuleList(Layer() for _ in range(layers))
        self.w = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return Costly.apply(x * self.w, self.fwd_s, self.bwd_s)


class Jitter(torch.nn.Module):
    """A transform that is a module (torchvision's are), with a known cost."""

    def __init__(self, s: float) -> None:
        super().__init__()
        self.s = s

    def forward(self, x):
        spin(self.s)
        return x


class Transformed(torch.utils.data.Dataset):
    def __init__(self, n: int, transform_s: float) -> None:
        self.x, self.t = torch.ones(n, 4), Jitter(transform_s)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return (self.t(self.x[i]),)


class SlowSGD(torch.optim.SGD):
    def __init__(self, params, opt_s):
        super().__init__(params, lr=0.01)
        self.opt_s = opt_s

    def step(self, closure=None):
        spin(self.opt_s)
        return super().step(closure)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--forward-ms", type=float, default=6.0)
    ap.add_argument("--backward-ms", type=float, default=10.0)
    ap.add_argument("--optimizer-ms", type=float, default=3.0)
    ap.add_argument("--other-ms", type=float, default=1.0, help="the loop's own work")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--nested", type=int, default=0, help="layers inside the model")
    ap.add_argument("--plain-optimizer", action="store_true")
    ap.add_argument("--transform-ms", type=float, default=0.0, help="a module, per sample")
    ap.add_argument("--save", default="", help="torch.save(model) and deepcopy each epoch")
    a = ap.parse_args()
    model = Model(a.forward_ms / 1000, a.backward_ms / 1000, a.nested)
    opt = SlowSGD(model.parameters(), a.optimizer_ms / 1000)
    data = Transformed(160, a.transform_ms / 1000) if a.transform_ms else \
        TensorDataset(torch.ones(160, 4))
    loader = DataLoader(data, batch_size=8)
    total = 0.0
    took = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0, "other": 0.0}
    steps = 0
    for _ in range(a.epochs):
        for (x,) in loader:
            t0 = time.perf_counter()
            out = model(x)
            t1 = time.perf_counter()
            loss = out.sum()
            loss.backward()
            t2 = time.perf_counter()
            if a.plain_optimizer:  # a hand-written update: no torch optimizer step hook
                spin(a.optimizer_ms / 1000)
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.01 * p.grad
                        p.grad = None
            else:
                opt.step()
                opt.zero_grad()
            t3 = time.perf_counter()
            spin(a.other_ms / 1000)
            total += float(loss)
            t4 = time.perf_counter()
            steps += 1
            for k, dt in zip(took, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                took[k] += dt
        if a.save:
            torch.save(model, a.save)
            copy.deepcopy(model)
    if a.save:
        m = torch.load(a.save, weights_only=False)
        hooks = len(m._forward_hooks) + len(m._forward_pre_hooks)
        print(f"saved whole: {type(m).__name__}, {hooks} hooks", flush=True)
    # what each phase took here, by this script's own clock: on a busy box a sleep wakes
    # late, and the probe's figures are checked against these, not the nominal costs
    mean = " ".join(f"{k}={v / max(steps, 1) * 1000:.3f}" for k, v in took.items())
    print(f"measured ms: {mean}")
    print(f"done {total:.1f}")


if __name__ == "__main__":
    main()
