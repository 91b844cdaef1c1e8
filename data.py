"""The data sets: CIFAR-10 through torchvision, or a synthetic stand-in that needs no download.

    train_set, test_set, name = get_datasets("auto", "data")   # on every rank, after set-up

Both give (image, label) pairs: a float tensor of shape 3x32x32, normalised, and an int
label in 0..9. "auto" uses CIFAR-10 when it is on disk or can be downloaded, and
otherwise says so loudly and uses the synthetic set.
"""
import os
import socket

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import Subset, TensorDataset

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def synthetic_cifar(num_train=10000, num_test=2000, seed=0, noise=3.0, train_samples=None, test_samples=None):
    """CIFAR-shaped data that a CNN can learn, made the same on every rank from `seed`.

    Each of the 10 classes is a smooth random colour pattern; an image is its class's
    pattern at a random contrast, shifted by up to 4 pixels, under heavy Gaussian noise.
    The CNN needs a couple of epochs to pass 90% test accuracy, so training visibly
    works offline. Only the first train_samples (test_samples) images are made, where
    given: the same images as the whole set's first ones, in a fraction of the time.
    """
    g = torch.Generator().manual_seed(seed)
    patterns = F.interpolate(torch.randn(10, 3, 8, 8, generator=g), size=32, mode="bilinear")
    patterns /= patterns.std(dim=(1, 2, 3), keepdim=True)

    def make(n, g, made):
        # Every image's label, contrast and shift are drawn first, then the noise image after image
        # (torch.randn fills in order): the first `made` images are the same whatever `made` is, and
        # a run of 1024 images does not pay for 10,000 (0.6 s a rank for 10,000 + 2,000).
        labels = torch.randint(0, 10, (n,), generator=g)
        contrast = 0.5 + torch.rand(n, 1, 1, 1, generator=g)
        shifts = torch.randint(-4, 5, (n, 2), generator=g).tolist()
        made = n if made is None else max(0, min(made, n))
        images = patterns[labels[:made]] * contrast[:made]
        rolled = [torch.roll(image, shift, dims=(1, 2)) for image, shift in zip(images, shifts)]
        images = torch.stack(rolled) if rolled else images  # --train-samples 0: none (train_ddp.py says so)
        images += noise * torch.randn(images.shape, generator=g)
        images /= (1 + noise**2) ** 0.5  # about unit variance, like normalised CIFAR-10
        return TensorDataset(images, labels[:made])

    # separate generators, so the test set does not change with the size of the train set
    train = make(num_train, torch.Generator().manual_seed(seed + 1), train_samples)
    test = make(num_test, torch.Generator().manual_seed(seed + 2), test_samples)
    return train, test


def matching_torchvision():
    """The torchvision release that goes with this torch ("0.29.*" for torch 2.14): 0.(minor + 15)."""
    major, minor = (int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    return f"0.{minor + 15}.*" if major == 2 else "the one for your torch (pytorch.org)"


def torchvision_problem():
    """None if torchvision's datasets import, else one line: what broke and what to reinstall.

    A torchvision built for another torch fails at import ("operator torchvision::nms does not
    exist", an undefined symbol): that is an installation to repair, not a data set to download."""
    try:
        from torchvision import datasets, transforms  # noqa: F401
    except Exception as error:  # ImportError, or the RuntimeError of a torchvision built for another torch
        first = (str(error).strip().splitlines() or [""])[0][:200]
        return (f"torchvision cannot be imported ({type(error).__name__}: {first}). Reinstall the torchvision "
                f"that matches torch {torch.__version__}: pip install --force-reinstall "
                f"\"torchvision=={matching_torchvision()}\" (on a machine without a GPU add --index-url "
                "https://download.pytorch.org/whl/cpu), or train without it: --data synthetic")
    return None


def cifar10_on_disk(root):
    """Whether root holds CIFAR-10, extracted or as the archive a download leaves."""
    return any(os.path.exists(os.path.join(root, name)) for name in ("cifar-10-batches-py", "cifar-10-python.tar.gz"))


def cifar10(root, download=False):
    """CIFAR-10's train and test sets (50,000 and 10,000 images) from `root`, normalised."""
    from torchvision import datasets, transforms  # imported here: the synthetic path needs no torchvision

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD)])
    train = datasets.CIFAR10(root, train=True, download=download, transform=transform)
    test = datasets.CIFAR10(root, train=False, download=download, transform=transform)
    return train, test


def _load_cifar10(root, download):
    """((train, test), None) if CIFAR-10 can be read from root, else (None, why not)."""
    old_timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(30)  # offline, fail in seconds rather than hang
    missing = []  # the folders a download would create, deepest first
    folder = os.path.abspath(root)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        missing.append(folder)
        folder = os.path.dirname(folder)
    try:
        return cifar10(root, download=download), None
    except Exception as error:  # no data, a corrupted archive, no network: all mean "not available"
        for folder in missing:  # a failed download leaves no empty folders behind
            try:
                os.rmdir(folder)
            except OSError:  # not empty (something was written there) or never made
                if os.path.exists(folder):
                    break
        return None, f"{type(error).__name__}: {error}"
    finally:
        socket.setdefaulttimeout(old_timeout)


def get_datasets(choice, root, seed=0, train_samples=None, test_samples=None):
    """(train_set, test_set, name) on every rank, each cut to its first train_samples / test_samples
    items (all of them for None); call it on every rank after set-up.

    choice: "synthetic", "cifar10" (an error if it cannot be had) or "auto". Only rank 0
    downloads, while the others wait for its verdict: several ranks downloading into one
    folder at once corrupt the archive. On a cluster without a shared file system,
    download CIFAR-10 on every node beforehand.
    """
    def synthetic():  # only the images that are read are made
        return (*synthetic_cifar(seed=seed, train_samples=train_samples, test_samples=test_samples), "synthetic")

    if choice == "synthetic":
        return synthetic()
    rank = dist.get_rank()
    sets, problem = None, None
    broken = torchvision_problem()  # checked apart: a broken install is not a failed download
    if broken is None and rank == 0:
        sets, problem = _load_cifar10(root, download=False)
        if sets is None:
            sets, problem = _load_cifar10(root, download=True)
    verdict = [problem]
    dist.broadcast_object_list(verdict, src=0)  # also the barrier the other ranks wait at
    problem = verdict[0]
    if broken is not None:
        if choice == "cifar10" or cifar10_on_disk(root):  # the data is there: falling back would change the run
            raise ValueError(f"--data {choice}: CIFAR-10 needs torchvision, and {broken}")
        if rank == 0:
            _banner(f"torchvision is broken, so CIFAR-10 cannot be read:\n!!   {broken}")
        return synthetic()
    if problem is None:
        if sets is None:
            sets, problem = _load_cifar10(root, download=False)
            if problem:
                raise ValueError(f"rank {rank} cannot read CIFAR-10 in {os.path.abspath(root)} ({problem}); "
                                 "without a shared file system, download it on every node first")
        return first_n(sets[0], train_samples), first_n(sets[1], test_samples), "cifar10"
    if choice == "cifar10":
        raise ValueError(f"CIFAR-10 is not in {os.path.abspath(root)} and could not be downloaded ({problem}). "
                         "Put cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html there, "
                         "or train offline with --data synthetic")
    if rank == 0:
        _banner(f"CIFAR-10 is not in {os.path.abspath(root)} and could not be downloaded:\n!!   {problem[:300]}")
    return synthetic()


def _banner(why):
    line = "!" * 78
    print(f"{line}\n!! {why}\n!! Training on the built-in SYNTHETIC data set instead (--data synthetic).\n"
          f"!! Use --data cifar10 to make this an error.\n{line}", flush=True)


def first_n(dataset, n):
    """The first n items of dataset (--train-samples, --test-samples); all of them for n None."""
    return dataset if n is None or n >= len(dataset) else Subset(dataset, range(n))
