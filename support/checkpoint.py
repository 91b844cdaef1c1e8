"""What train_ddp.py's --checkpoint-dir needs around Task 8 (template_checkpoint.py): the flags,
their checks, the tasks a run with checkpoints trains with, and the Checkpointer it makes."""


def add_arguments(parser):
    group = parser.add_argument_group("checkpoints (Task 8, template_checkpoint.py)")
    group.add_argument("--checkpoint-dir", default=None,
                       help="rank 0 saves a checkpoint here after every epoch (last.pt, previous.pt), and a run "
                       "that finds one resumes from it, also after a torchrun restart (default: no checkpoints)")
    group.add_argument("--checkpoint-every", type=int, default=None,
                       help="with --checkpoint-dir, also save every N optimizer steps, so that a failure loses at "
                       "most N steps; SIGUSR1 saves at the next step and stops (default: at epoch ends only)")


def refusal(args):
    """What is wrong with the checkpoint flags, or None."""
    if args.checkpoint_dir is None and args.checkpoint_every:
        return "--checkpoint-every needs --checkpoint-dir: where should the checkpoints go?"
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        return f"--checkpoint-every must be at least 1, got {args.checkpoint_every}"
    return None


def tasks(args):
    """--checkpoint-dir trains with Tasks 8.1 and 8.2, and under --shard with 8.3 and 8.4 (sharded files):
    (file, function) pairs for strategies' "not done yet" check."""
    names = ["save_checkpoint", "load_checkpoint"] + (["shard_index", "read_overlaps"] if args.shard != "none" else [])
    return [("template_checkpoint.py", name) for name in names] if args.checkpoint_dir else []


def make_checkpointer(args, lib, model, optimizer, world_size, data_name, device, steps_per_epoch):
    """--checkpoint-dir: check the folder, resume from its newest checkpoint; None without it. `lib`:
    template_checkpoint of --impl."""
    if args.checkpoint_dir is None:
        return None
    checkpointer = lib.Checkpointer(args.checkpoint_dir, args.checkpoint_every, model, optimizer,
                                    lib.run_arguments(args, world_size, data_name), device, steps_per_epoch)
    if checkpointer.epochs_done >= args.epochs and lib.get_rank() == 0:  # it used to end here without a word
        print(f"{args.checkpoint_dir} holds {checkpointer.epochs_done} epochs already, --epochs {args.epochs}: "
              "nothing to train; a larger --epochs trains on from there", flush=True)
    return checkpointer
