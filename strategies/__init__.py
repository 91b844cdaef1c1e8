"""How train_ddp.py parallelises: one class per strategy, a mixin per feature flag, and the
registry that picks them from the flags.

    strategy = choose(args)(args)                  # ValueError: flags that cannot work together
    train_loader, test_loader = strategy.loaders(...)   # the slice of each global batch this rank reads
    model = strategy.wrap(strategy.build_model(device))   # broadcast, buckets, shards, splits, stages, ...
    optimizer = strategy.optimizer(model, optimizer_cls, optimizer_kwargs)
    trainer.train_one_epoch(model, ..., strategy.sync_gradients,   # between backward and step
                            forward_backward=strategy.forward_backward)
    samples, loss_sum = strategy.totals(stats, device)   # over all ranks, each image counted once
    result = strategy.evaluate(model, test_loader, device)
    print(strategy.start_line(), strategy.sync_line(stats))   # what the start and epoch lines say
    same, line = strategy.consistency(model)       # the end-of-run check, and its line

A strategy (strategies/base.py's Strategy and its subclasses) owns the flags that choose it
(chosen_by), those it cannot combine with (refusal), the template files it trains with (files,
needs), and each step above. A feature is a flag any strategy can take (--shard optimizer): a
mixin (base.Feature) that overrides only what it changes and calls super(); choose() puts every
feature the flags ask for in front of the one strategy they choose. train_ddp.py never asks which
strategy or feature runs.

To add a strategy or a feature: a new file here with its classes, its flags (add_arguments) and
its lists STRATEGIES and FEATURES, and one line in PLUGINS below (docs/maintainers.md, "Adding a
strategy").
"""
from strategies import (base, batchnorm, compression, context_parallel, data_parallel, experts, local_sgd, pipeline,
                        sequence_parallel, sharded, tensor_parallel)
from strategies.course_files import has_solutions

# Every file that brings strategies, features or flags, in the order of the course. A plugin may
# define add_arguments(parser) (its flags, in a --help group of its own), refusal(args) (what is
# wrong with its flags whatever the strategy), STRATEGIES and FEATURES. Strategies are asked the
# other way round, the last plugin first and in each plugin's list order: a later one builds on the
# earlier ones and claims its flags before them; base.Strategy, asked last, claims whatever is left.
PLUGINS = [
    base,             # Task 2: broadcast, then average the gradients after backward
    data_parallel,    # Tasks 3, 5 and PyTorch's DDP: --allreduce, --sync, --bucket-mb, --impl ddp
    sharded,          # Tasks 6, 7: --shard optimizer (a feature), --shard full
    tensor_parallel,  # Task 9: --tp
    pipeline,         # Task 10: --pp, --microbatches, --schedule
    batchnorm,        # Task 11: --batchnorm local or sync (a feature)
    compression,      # Task 12: --compress, --powersgd-rank (a feature: DDP's communication hooks)
    local_sgd,        # Task 13: --local-sgd, --diloco, --outer-lr, --outer-momentum
    sequence_parallel,  # Task 14: --model vit --tp, --sp
    context_parallel,   # Task 15: --cp, --cp-impl
    experts,            # Task 16: --moe (a feature: the ViT's mixtures of experts), --ep, --top-k, --capacity-factor
]


def add_arguments(parser):
    """Every plugin's flags, each plugin in a group of train_ddp.py's --help of its own."""
    for plugin in PLUGINS:
        if hasattr(plugin, "add_arguments"):
            plugin.add_arguments(parser)


def choose(args):
    """The strategy class the flags ask for, with the features they ask for in front of it;
    ValueError with one line if they cannot work together."""
    if args.impl == "solutions" and not has_solutions():
        raise ValueError("--impl solutions trains with the reference answers, which this copy of the course does "
                         "not have: train with --impl template (your files) or --impl ddp (PyTorch's)")
    for plugin in PLUGINS:
        refusal = plugin.refusal(args) if hasattr(plugin, "refusal") else None
        if refusal:
            raise ValueError(refusal)
    strategy = next(cls for plugin in reversed(PLUGINS) for cls in getattr(plugin, "STRATEGIES", [])
                    if cls.chosen_by(args))
    features = [cls for plugin in PLUGINS for cls in getattr(plugin, "FEATURES", []) if cls.chosen_by(args)]
    if features:
        strategy = type("+".join(cls.__name__ for cls in features + [strategy]), (*features, strategy), {})
    refusal = strategy.refusal(args)
    if refusal:
        raise ValueError(refusal)
    return strategy
