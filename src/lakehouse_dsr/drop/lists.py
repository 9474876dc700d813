"""The lists DROP sends: no Spark here, so the control plane (import, status, export) can name them."""

# By the name the data map's `drop:` section uses, with the fields each list's hash is made of, in order.
LISTS: dict[str, tuple[str, ...]] = {
    "email": ("email",), "phone": ("phone",), "maid": ("maid",), "ctvid": ("ctvid",),
    "ndz": ("first_name", "last_name", "dob", "zip"), "namevin": ("first_name", "last_name", "vin"),
}
# As DROP spells them in file names and in the Removed file's ListType (lowered: the names above).
DROP_NAMES: dict[str, str] = {"email": "Email", "phone": "Phone", "maid": "MAID", "ctvid": "CTVID", "ndz": "NDZ",
                              "namevin": "NameVIN"}
