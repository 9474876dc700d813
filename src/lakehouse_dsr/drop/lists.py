"""The lists DROP sends: no Spark here, so the control plane (import, status, export) can name them."""

from ..datamap.model import DROP_LISTS as LISTS

__all__ = ["DROP_NAMES", "LISTS"]

# As DROP spells them in file names and in the Removed file's ListType (lowered: the data map's names).
DROP_NAMES: dict[str, str] = {"email": "Email", "phone": "Phone", "maid": "MAID", "ctvid": "CTVID", "ndz": "NDZ",
                              "namevin": "NameVIN"}
