"""Adapters for what callers hold as ``connection=``: SQLAlchemy and Django.

:meth:`ptb_fence.Attempt.transaction`, :meth:`~ptb_fence.Attempt.owns` and
:meth:`~ptb_fence.Attempt.run_in_transaction` pick the adapter from the object's type. These
modules are imported only then, so ``import ptb_fence`` never imports SQLAlchemy or Django.
"""

__all__: "list[str]" = []
