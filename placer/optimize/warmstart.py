"""Starting points for the exact backends from a known plan of the same configuration
(the heuristic's, issue 12 item 3): the first round's values for the formulations'
`start_from` (CP-SAT solution hints, a HiGHS MIP start).

A start only guides the search; it never changes the model, the optimum or the proof.
The start covers the placement and the waves (replica counts per chain type, chain types
in use, one wave option per route); both solvers complete or repair the rest.
"""

from __future__ import annotations

from typing import Any

from placer.optimize.data import InnerData, InnerSolution


def start_values(
    data: InnerData, hint: InnerSolution, n: dict[int, Any], u: dict[int, Any], y: dict[Any, Any]
) -> list[tuple[Any, int]]:
    """(variable, value) pairs of a plan: n[c], u[c] and the wave one-hot y[r, i]."""
    out: list[tuple[Any, int]] = []
    for c, var in n.items():
        out.append((var, int(hint.counts.get(c, 0))))
    for c, var in u.items():
        out.append((var, int(hint.counts.get(c, 0) > 0)))
    for (r, i), var in y.items():
        out.append((var, int(data.wave_options[r][i].waves == hint.waves.get(r, 0))))
    return out


def hint_from_plan(
    data: InnerData, counts: dict[tuple[str, ...], int], waves: dict[Any, int]
) -> InnerSolution | None:
    """The plan as this configuration's chain indices and waves (None when one of its
    chains is not a chain type of the model)."""
    index = {c: i for i, c in enumerate(data.chains)}
    if any(c not in index for c in counts):
        return None
    return InnerSolution({index[c]: n for c, n in counts.items()}, dict(waves), 0.0, 0.0, False)
