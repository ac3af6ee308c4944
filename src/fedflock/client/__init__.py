"""Client tasks (what a server asks, what a client computes on its own data), the objectives
they train and score with, and the executors that run them. Import the pieces from their
modules (`fedflock.wire`, `.tasks`, `.runtime`, `.executors`): this package re-exports
nothing, so importing a task definition never pulls in the runtime."""
