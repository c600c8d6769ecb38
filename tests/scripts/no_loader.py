"""A user's script that batches tensors itself, as pytorch/examples word_language_model
does: no torch DataLoader is ever iterated."""
import torch

data = torch.arange(4000, dtype=torch.float32).view(-1, 20)
model = torch.nn.Linear(20, 1)
opt = torch.optim.SGD(model.parameters(), lr=1e-6)
for epoch in range(2):
    for i in range(0, data.size(0), 10):
        batch = data[i:i + 10]
        opt.zero_grad()
        model(batch).mean().backward()
        opt.step()
    print(f"epoch {epoch} done", flush=True)
