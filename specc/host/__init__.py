"""The machine an engine compiles and runs on: which device (`device`), how many CPU threads (`threads`), what the CPU is (`cpuinfo`), and memory on huge pages (`huge_pages`, `collapsed_pages`)."""
