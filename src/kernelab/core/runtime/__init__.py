"""Shared by every op family: where Triton runs, launch helpers, argument checks, input
generation, model shapes, tuned configs, backends. No family imports another family's private
names; what two families share lives here."""
