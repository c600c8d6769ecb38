"""A training loop over a torch.compile'd model (no monitor imports), for the phase tests:
`--compiled module` compiles the model (`torch.compile(model)`, the common way), `function`
compiles a function that calls it (the model's modules are then only ever called inside the
compiled code), `optimizer` the optimizer's step (dynamo then guards on its step hooks). The
"eager" backend: dynamo traces, guards and recompiles as with inductor, without inductor's
minutes of code generation. Prints dynamo's counters as a JSON line."""
import argparse
import json

import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compiled", choices=("module", "function", "optimizer"),
                    default="module")
    ap.add_argument("--epochs", type=int, default=3)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = opt.step
    if a.compiled == "module":
        forward = torch.compile(model, backend="eager")
    elif a.compiled == "function":
        forward = torch.compile(lambda x: model(x), backend="eager")
    else:  # the optimizer's step compiled (PyTorch's "compiling the optimizer" recipe)
        forward, step = model, torch.compile(opt.step, backend="eager")
    loader = DataLoader(TensorDataset(torch.randn(256, 8), torch.randn(256, 1)), batch_size=16)
    for _ in range(a.epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(forward(x), y)
            opt.zero_grad()
            loss.backward()
            step()
    from torch._dynamo.utils import counters

    print(json.dumps({"graphs": counters["stats"]["unique_graphs"],
                      "graph_breaks": sum(counters["graph_break"].values()),
                      "loss": round(loss.item(), 6)}), flush=True)


if __name__ == "__main__":
    main()
