"""Alembic migrations for Crucible's database (env, script template, ``versions/``).

A package so the wheel ships it: ``service.db.engine.Database.migrate`` finds this
directory through ``migrations.__file__``, installed or in a checkout. Add a revision as
``versions/NNNN_<what>.py`` with ``down_revision`` set to the current head.
"""
