"""The terminal side of long work: stage progress on stderr (`progress`) and SIGINT/SIGTERM as exceptions (`interrupts`)."""
