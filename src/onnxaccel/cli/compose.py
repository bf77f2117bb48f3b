"""Commands composed from argument groups: each group declares its options once and builds its object.

A group (:class:`Group`) lists its options as :class:`inspect.Parameter` objects (:func:`option`,
:func:`argument`: a Typer ``Annotated[type, typer.Option(...)]`` annotation and a default) and turns their
values into the object the command works with (:meth:`Group.build`): a ``Target``, a ``ServerConfig``, the
bound shapes. :func:`composed` makes a command from groups, as Polygraphy's tools do with their argument
groups (NVIDIA/TensorRT, tools/Polygraphy/polygraphy/tools/args/base.py, ``BaseArgs.add_parser_args`` /
``parse_impl``)::

    @handle_errors
    @composed(SourceArg("An .onnx file."), TargetArgs(), ShapeArgs(), OutputArgs())
    def warm_command(model: str, target: Target, shapes: Shapes, as_json: bool) -> None: ...

Typer reads a command's options from its signature (``inspect.signature``, then ``typing.get_type_hints``
for plain annotations), so :func:`composed` gives the command the signature of its groups' parameters, in
the groups' order or in the order given (``order=``: the order of the flags in ``--help``). When the command
runs, each group builds its object from its options' values and the body gets one object per group, in the
decorator's order. A group's :meth:`~Group.build` may ask for another group's object (``ctx[ConfigArgs]``),
which is then built first; ``ctx.get`` answers None for a group the command does not have.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Annotated, Any

import typer

_KEYWORD = inspect.Parameter.KEYWORD_ONLY  # keyword-only: an option with a default may precede one without
#: The default of a required option or argument.
REQUIRED = inspect.Parameter.empty


def option(name: str, kind: Any, default: Any = REQUIRED, *decls: str, **info: Any
           ) -> inspect.Parameter:
    """The command parameter ``name`` for one option: ``typer.Option(*decls, **info)`` of type ``kind``;
    ``REQUIRED`` (no default) makes it required."""
    return inspect.Parameter(name, _KEYWORD, default=default, annotation=Annotated[kind, typer.Option(*decls, **info)])


def argument(name: str, kind: Any, default: Any = REQUIRED, **info: Any) -> inspect.Parameter:
    """The command parameter ``name`` for one positional argument: ``typer.Argument(**info)``."""
    return inspect.Parameter(name, _KEYWORD, default=default, annotation=Annotated[kind, typer.Argument(**info)])


def with_help(param: inspect.Parameter, text: str) -> inspect.Parameter:
    """``param`` with another help text (a variant of a shared option: same flags, type and default)."""
    info = copy.copy(param.annotation.__metadata__[0])
    info.help = text
    return param.replace(annotation=Annotated[param.annotation.__origin__, info])


class Group:
    """An argument group: the options it declares (:meth:`params`) and the object it builds (:meth:`build`).

    Subclasses set ``PARAMS`` (the options every use of the group has) or override :meth:`params` when the
    options depend on how the group was made (``TargetArgs(precision=None)`` has no ``--precision``)."""

    PARAMS: tuple[inspect.Parameter, ...] = ()

    def params(self) -> Iterable[inspect.Parameter]:
        """The options of this group, in their --help order."""
        return self.PARAMS

    def build(self, v: SimpleNamespace, ctx: Built) -> Any:
        """The group's object from its options' values ``v`` (one attribute per parameter)."""
        raise NotImplementedError


class Built:
    """The objects of one command's groups, built on first use from the command line's values."""

    def __init__(self, groups: tuple[Group, ...], names: dict[int, list[str]], values: dict[str, Any]):
        self._groups, self._names, self._values = groups, names, values
        self._built: dict[int, Any] = {}

    def _find(self, which: type[Group] | Group) -> Group | None:
        return next((g for g in self._groups if g is which or (isinstance(which, type) and isinstance(g, which))),
                    None)

    def __getitem__(self, which: type[Group] | Group) -> Any:
        group = self._find(which)
        if group is None:
            raise KeyError(f"this command has no {which}")
        key = id(group)
        if key not in self._built:
            values = SimpleNamespace(**{n: self._values[n] for n in self._names[key]})
            self._built[key] = group.build(values, self)
        return self._built[key]

    def given(self, name: str) -> Any:
        """The command line's value of parameter ``name`` (of any group), as Typer passed it."""
        return self._values[name]

    def get(self, which: type[Group] | Group) -> Any:
        """The object of group ``which`` (a class or the instance), or None when the command has none."""
        return self[which] if self._find(which) is not None else None


def composed(*groups: Group, order: str | None = None) -> Callable[[Callable], Callable]:
    """Make a Typer command from ``groups``: its options are theirs (in ``order``, space-separated parameter
    names, when given: every name once), and its body is called with one built object per group."""
    names = {id(g): [p.name for p in g.params()] for g in groups}
    params = {p.name: p for g in groups for p in g.params()}
    if sum(map(len, names.values())) != len(params):
        raise TypeError("two groups declare a parameter of the same name")
    if order is not None:
        wanted = order.split()
        if sorted(wanted) != sorted(params):
            raise TypeError(f"order= must name every parameter once: {sorted(set(wanted) ^ set(params))}")
        params = {n: params[n] for n in wanted}

    def decorate(body: Callable) -> Callable:
        @functools.wraps(body)
        def command(**values: Any) -> Any:
            ctx = Built(groups, names, values)
            return body(*(ctx[g] for g in groups))

        command.__signature__ = inspect.Signature(list(params.values()))
        command.__annotations__ = {p.name: p.annotation for p in params.values()}
        command.__groups__ = groups
        return command

    return decorate
