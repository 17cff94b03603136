/* Uses vaswap's C API from an install (find_package or pkg-config): the header's version against
 * the library's, one slot on the device (the simulated one in CI), and a refused call's status
 * and message. Prints what it checked; exits 1 on the first mismatch. */
#include <stdio.h>
#include <string.h>
#include <vaswap/vaswap.h>

#define MiB ((size_t)1 << 20)

static int failed(const char* what, vaswap_status status) {
  fprintf(stderr, "consumer: %s: %s: %s\n", what, vaswap_status_name(status), vaswap_last_error());
  return 1;
}

int main(void) {
  char header[32];
  snprintf(header, sizeof header, "%d.%d.%d", VASWAP_VERSION_MAJOR, VASWAP_VERSION_MINOR,
           VASWAP_VERSION_PATCH);
  if (strcmp(header, vaswap_version()) != 0) {
    fprintf(stderr, "consumer: header %s, library %s\n", header, vaswap_version());
    return 1;
  }
  printf("version %s\n", vaswap_version());

  vaswap_slot slot = NULL;
  vaswap_status status = vaswap_slot_create(0, 3 * MiB, &slot);
  if (status != VASWAP_OK) return failed("vaswap_slot_create", status);
  vaswap_slot_info info;
  status = vaswap_slot_get_info(slot, &info);
  if (status != VASWAP_OK) return failed("vaswap_slot_get_info", status);
  printf("slot: %zu bytes asked, %zu mapped, address aligned to 2 MiB: %s\n", info.bytes,
         info.mapped_bytes, info.va % (2 * MiB) == 0 ? "yes" : "no");
  status = vaswap_slot_destroy(slot);
  if (status != VASWAP_OK) return failed("vaswap_slot_destroy", status);

  status = vaswap_slot_create(0, 0, &slot);
  printf("zero bytes: %s: %s\n", vaswap_status_name(status), vaswap_last_error());
  return 0;
}
