"""What the orchestrator needs of images on demand (images/on_demand.py, which the node
composes in): a Protocol, so this plane does not import the images plane."""

from __future__ import annotations

from typing import Protocol


class ImageTemplates(Protocol):
    def image_in(self, metadata: dict[str, str]) -> str | None:
        """The image a create's metadata names (the operator's key), if any."""

    def is_image(self, name: str) -> bool:
        """Whether a create's template, no template by that name, may be an image."""

    async def template_for(self, text: str, team_id: str | None = None) -> str:
        """The template made of image `text` (made now if need be), if `team_id` may pull
        it."""

    def made(self) -> dict[str, str]:
        """Each image whose template the node holds, with that template's name."""
