"""GPU device APIs of the device runtime: each one a driver library reached through ctypes (``libOpenCL.so``,
``libvulkan.so``, ``libcuda.so``), behind the one interface of :mod:`.api`."""
