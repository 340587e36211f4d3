"""ActFirst. Importing the package fixes the process's thread count before torch is imported
(``actfirst.core.threads``)."""

from actfirst.core.threads import fix_thread_count

fix_thread_count()
