"""PyTorch Geometric's examples/mutag_gin.py, in its shape and offline (no monitor imports):
188 small random graphs (as MUTAG's), 150 to train in batches of 10 (15 a epoch), a GIN
model, and each epoch train() then `test(train_loader)` and `test(test_loader)` under
@torch.no_grad(). `python pyg_mutag.py [EPOCHS]` (20)."""
import sys

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GINConv, global_add_pool

torch.manual_seed(0)
graphs = []
for i in range(188):
    n = 10 + i % 8
    edge = torch.randint(0, n, (2, 2 * n))
    graphs.append(Data(x=torch.randn(n, 7), edge_index=edge, y=torch.tensor([i % 2])))
train_ds, test_ds = graphs[:150], graphs[150:]
epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
train_loader = DataLoader(train_ds, batch_size=10, shuffle=True)   # 15 batches
test_loader = DataLoader(test_ds, batch_size=10)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = GINConv(torch.nn.Sequential(torch.nn.Linear(7, 32), torch.nn.ReLU(),
                                              torch.nn.Linear(32, 32)))
        self.lin = torch.nn.Linear(32, 2)

    def forward(self, x, edge_index, batch):
        x = self.c1(x, edge_index).relu()
        return self.lin(global_add_pool(x, batch))


model = Net()
opt = torch.optim.Adam(model.parameters(), lr=0.01)


def train():
    model.train()
    total = 0
    for data in train_loader:
        opt.zero_grad()
        out = model(data.x, data.edge_index, data.batch)
        loss = F.cross_entropy(out, data.y)
        loss.backward()
        opt.step()
        total += float(loss) * data.num_graphs
    return total / len(train_loader.dataset)


@torch.no_grad()
def test(loader):
    model.eval()
    correct = 0
    for data in loader:
        pred = model(data.x, data.edge_index, data.batch).argmax(dim=-1)
        correct += int((pred == data.y).sum())
    return correct / len(loader.dataset)


for epoch in range(1, epochs + 1):
    loss = train()
    train_acc, test_acc = test(train_loader), test(test_loader)
    print(f"epoch {epoch}: loss {loss:.3f} train {train_acc:.2f} test {test_acc:.2f}",
          flush=True)
print(f"done {epochs} epochs", flush=True)
