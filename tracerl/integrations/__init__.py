"""Bridges to other training frameworks; each is an optional extra, imported only here."""
