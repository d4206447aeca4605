"""The top floor: the `tianji` command (`tianjictl.main`, which registers every component's commands). The HTTP
client of the tenant and operator API it speaks is the ground floor's (`tianji.api_client`), which the emulated
cluster, the tests and the benches use without the command. Nothing below imports it."""
