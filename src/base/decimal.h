/* What counts as a number where a person types one (a flag, an environment variable).
 *
 * strtod would also take "0x10" (16), "inf", "nan" and leading blanks, strtoll leading blanks; none of
 * them is what a user means by a learning rate, a step count or a timeout. So a number must be plain
 * decimal before it is converted: integers [+-]digits; reals [+-]digits[.digits][e[+-]digits], or
 * .digits. */
#ifndef FSDP_BASE_DECIMAL_H
#define FSDP_BASE_DECIMAL_H

/* 1 when the whole of `s` is a plain decimal integer (real = 0) or real number (real = 1). */
int fsdp_plain_decimal(const char *s, int real);

#endif
