"""Command-line tools: `python -m eager_neuron.tools.<name> --help`."""
