"""The CIFAR-10 CNN every part of the course trains.

    from models import CNN
    model = CNN()                                   # 3x32x32 images in, 10 logits out
    logits = model(torch.randn(8, 3, 32, 32))       # shape (8, 10)

By default there is no BatchNorm, on purpose. BatchNorm normalises with the statistics
of the batch it sees, and under data parallelism each rank sees only its own slice of the
global batch, so the model would compute something different from single-process training
on the whole batch; its running statistics (buffers, not parameters) would also drift apart
between ranks. Without it, data-parallel training here is exactly single-process training on
the global batch, which is what the tests check.

    model = CNN(batchnorm=True)     # a BatchNorm2d after each convolution: Task 11

makes that exception visible: train it with `train_ddp.py --batchnorm local` (each rank its
slice's statistics) or `--batchnorm sync` (Task 11's SyncBatchNorm, the global batch's).
PyTorch's own torch.nn.SyncBatchNorm runs on GPUs only: on a CPU (gloo) it raises
"SyncBatchNorm expected input tensor to be on GPU" in training; Task 11's runs on both
(docs/task11-batchnorm.md).
"""
import torch
from torch import nn


class CNN(nn.Module):
    """Two 5x5 convolutions with max-pooling, then two linear layers (about 0.28M parameters).

    batchnorm=True puts an nn.BatchNorm2d after each convolution (96 more parameters, and the
    running statistics as buffers); the default model is unchanged, so every result measured
    without it stands."""

    def __init__(self, num_classes=10, batchnorm=False):
        super().__init__()

        def norm(channels):  # drawn after the convolutions: the same initial weights either way
            return [nn.BatchNorm2d(channels)] if batchnorm else []

        self.features = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=5, padding=2),   # 16x32x32
            *norm(16),
            nn.ReLU(),
            nn.MaxPool2d(2),                              # 16x16x16
            nn.Conv2d(16, 32, kernel_size=5, padding=2),  # 32x16x16
            *norm(32),
            nn.ReLU(),
            nn.MaxPool2d(2),                              # 32x8x8
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(32 * 8 * 8, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x))


def benchmark_model(name):
    """The models the benchmarks measure, the same on every rank: "cnn" (this course's CNN, 0.28M
    parameters) or "resnet18" (torchvision's ResNet-18 for 10 classes, 11.7M parameters)."""
    torch.manual_seed(0)
    if name == "cnn":
        return CNN()
    import torchvision  # only the benchmarks need it

    return torchvision.models.resnet18(num_classes=10)
