"""Operating kforge: the machine check (`doctor`), run control (stop, logs, watch, TensorBoard, rm) and
export of trained adapters. The CLI modules in kforge/cli parse arguments and print; the logic is here."""
