"""What the orchestrator needs of images on demand (images/on_demand.py, which the node
composes in): a Protocol, so this plane does not import the images plane."""

from __future__ import annotations

from typing import Protocol


class ImageTemplates(Protocol):
    def image_in(self, metadata: dict[str, str]) -> str | None:
        """The image a create's metadata names (the operator's key), if any."""

    def is_image(self, name: str) -> bool:
        """Whether a create's template, no template by that name, may be an image."""

    async def template_for(self, text: str) -> str:
        """The template made of image `text` (made now if need be)."""
