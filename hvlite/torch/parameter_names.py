"""Names of an optimizer's parameters, for naming their collectives the same on every rank.

Contract: ``parameter_names(params, named_parameters, first=0)`` returns {parameter: name}.
``named_parameters`` is ``model.named_parameters()`` (pairs), the bound method itself (Horovod
accepts it uncalled), or None (names by position: ``param.<i>``, from ``first``: parameters
added after wrapping continue the positions). Raises ValueError when names
repeat (naming them) or when some of ``params`` are not among the named ones.
``find_duplicates(items)``: the set of items that occur more than once (Horovod's
``_DistributedOptimizer.find_duplicates``, which the optimizers expose as a static method).
"""


def find_duplicates(items):
    seen, repeated = set(), set()
    for item in items:
        (repeated if item in seen else seen).add(item)
    return repeated


def parameter_names(params, named_parameters, first=0):
    if named_parameters is None:
        return {p: "param.%d" % (first + i) for i, p in enumerate(params)}
    if callable(named_parameters):      # model.named_parameters, not called
        named_parameters = named_parameters()
    named = list(named_parameters)
    repeated = find_duplicates(n for n, _ in named)
    if repeated:
        raise ValueError("named_parameters has duplicate names: %s" % ", ".join(sorted(repeated)))
    by_param = {p: n for n, p in named}
    unnamed = [i for i, p in enumerate(params) if p not in by_param]
    if unnamed:
        raise ValueError("named_parameters was given, but %d of the optimizer's parameters are "
                         "not in it (positions %s)" % (len(unnamed), unnamed[:10]))
    return {p: by_param[p] for p in params}
