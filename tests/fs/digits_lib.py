"""A small real training run for the mount tests and benchmarks: an MLP trained with AdamW (lr
1e-3, weight decay 0.01, batches of 128) on sklearn's digits, the real dataset Debian ships.
Deterministic: torch.manual_seed(0) first, then the model's initialisation and the batches."""
import torch
from sklearn.datasets import load_digits


def adamw_digits(hidden, classes, saves, steps=20):
    """Yields (model, optimizer, step) every `steps` steps, `saves` times; `hidden` are the
    hidden layers' widths (64 inputs, ReLU between layers, `classes` outputs)."""
    torch.manual_seed(0)
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16
    y = torch.tensor(y)
    layers, width = [], 64
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, classes))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    step = 0
    for _ in range(saves):
        for _ in range(steps):
            idx = torch.randint(0, len(x), (128,))
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
        yield model, opt, step
