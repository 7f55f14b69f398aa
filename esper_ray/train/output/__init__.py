"""What a command shows: progress bars and lines, a round's summary line, TensorBoard logs, how to open them."""
