"""The machine an engine compiles and runs on: which device (`device`) and how many CPU threads (`threads`)."""
