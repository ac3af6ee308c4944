"""No import cycles anywhere in the package, type-only imports included (the layers are
checked by import-linter in `make test`; this also catches cycles inside one layer)."""

from __future__ import annotations

import grimp
import networkx as nx


def test_the_package_has_no_import_cycle() -> None:
    graph = grimp.build_graph("fedflock", exclude_type_checking_imports=False)
    imports = nx.DiGraph()
    for module in graph.modules:
        imports.add_node(module)
        for imported in graph.find_modules_directly_imported_by(module):
            imports.add_edge(module, imported)
    assert len(imports) > 50
    cycles = list(nx.simple_cycles(imports))
    assert not cycles, f"import cycles: {cycles[:3]}"


def test_config_imports_nothing_above_it() -> None:
    graph = grimp.build_graph("fedflock")
    below = {"fedflock.errors", "fedflock.registry"}
    assert graph.find_upstream_modules("fedflock.config") <= below


def test_server_logic_loads_no_training_loop_engine_or_flower() -> None:
    """DESIGN: an algorithm never imports an engine, Flower or a training loop. The tasks it
    builds reach the training loop through the runtime, on the client's side only."""
    import subprocess
    import sys

    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, fedflock.algorithms; print(' '.join(sys.modules))"],
        capture_output=True, text=True, check=True).stdout.split()
    assert "fedflock.client.tasks" in loaded  # algorithms build tasks...
    for module in ("fedflock.client.training", "fedflock.client.runtime", "fedflock.engines",
                   "flwr"):
        assert module not in loaded  # ...without what runs them
