"""Assembling an ``Agent`` from a folder of instructions and tool modules."""
