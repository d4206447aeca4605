"""The top floor: the `tianji` command (`tianjictl.main`, which registers every component's commands) and the HTTP
client of the tenant and operator API it speaks (`tianjictl.client`, which the emulated cluster, the tests and the
benches use too). Nothing below imports it."""
