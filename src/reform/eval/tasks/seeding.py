"""Seeding and the random values needles carry, for every suite's generator (niah, ruler, babilong, shared)."""

from __future__ import annotations

import random
import uuid

DEPTHS_40 = [round(i * 100 / 39) / 100 for i in range(40)]
"""RULER's needle depth grid, ``np.round(np.linspace(0, 100, 40))`` percent, as fractions."""

_ADJECTIVES = """abandoned able absent abundant acidic adorable adventurous aggressive agreeable alert ancient angry
anxious ashamed attractive average awesome bashful beautiful bewildered bitter blushing bored brave breezy brief
bright broad bumpy calm careful charming cheerful chilly clever clumsy cold colossal cooperative courageous crazy
creepy crooked cruel curious cute damaged dangerous dark deep defiant delightful depressed determined different
dizzy doubtful drab dry dull eager early elated elegant embarrassed empty enchanting energetic enthusiastic envious
evil excited expensive faithful famous fancy fierce filthy fine fluffy foolish fragile frail frantic friendly
frightened funny fuzzy gentle giant gifted gleaming glorious good gorgeous graceful grumpy handsome happy harsh
healthy heavy helpful helpless hilarious homeless honest horrible hungry hurt icy ill immense important
impossible innocent itchy jealous jolly juicy kind large lazy light lively lonely long lucky magnificent mature
messy mighty misty modern mysterious narrow nasty naughty nervous nice noisy nutty obedient odd old orange
outrageous plain pleasant poised poor powerful precious prickly proud puzzled quaint quick quiet rapid rare real
relieved rich rough round rude sad scary selfish shaggy shallow shiny short shy silly skinny sleepy slimy slow
small smooth soft sparkling spicy splendid spotless square steep sticky stormy strange strong stupid successful
super sweet swift tall tame tasty tender tense terrible thankful thoughtful tiny tired tough troubled ugly uneven
unusual upset useful vast victorious vivacious wandering warm weak wealthy weary wet whispering wicked wide wild
witty wonderful worried wrong young zany zealous""".split()

_NOUNS = """account acoustics airport alarm anchor animal answer apparel apple army attack badge balance ball
balloon band basin basket bat battle beach bean bear bed bee beetle bell berry bike bird blade blanket boat bone
book boot bottle boundary box brain branch brass bread brick bridge brother bubble bucket building bulb butter
button cabbage cable cake camera camp candle canvas cap captain card carpenter carriage cart castle cattle cave
chain chair chalk channel cheese cherry chicken church circle city clock cloud coach coat coffee coin comb
copper cord corn cottage country cousin cow crayon cream creature crib crow crowd crown cup curtain cushion
dad daughter deer desk dinner doctor dog doll donkey door dragon drawer dress drum duck dust eagle earth
edge egg elbow engine engineer eye face fairy family farm father feather fence finger fire fish flag flame
flower fog fold food foot forest fork fountain frame friend frog fruit furniture game garden gate ghost giraffe
girl glass glove goat gold goose grape grass guitar hammer hand harbor hat hawk heart hill hole honey horn
horse hospital house icicle island jacket jelly jewel judge kettle key kitten kite knife ladder lake lamp
lantern leaf lemon letter library lighthouse lion lizard lock machine magnet map marble market meadow metal
milk mirror monkey moon mountain mouse muffin nail needle nest net night noodle notebook ocean office orange
oven owl paint palace pan paper parcel parrot pasta peach pear pebble pen pencil penguin piano picture pig
pillow pilot pipe planet plant plate pocket poem pony potato puppy puzzle queen quill rabbit radio rain
rainbow reward ribbon river road robin rock rocket roof room rose saddle sail salt sand scarf school seashore
shadow sheep shell ship shoe shop silver singer sister skate sky sled snail snake snow soap sock soup spade
sparrow spider spoon squirrel stage star station stick stone stove straw stream street string sugar sun swan
sweater table tail teacher temple tent thread throne ticket tiger toad tomato tooth tower town toy train tree
truck trumpet tunnel turkey turtle umbrella valley vase village violin wagon wall wallet watch water wave
whale wheel whistle window wing winter wizard wolf wood wool yard zebra""".split()


def sample_rng(seed: int, *parts) -> random.Random:
    """The generator of one row: a pure function of the seed and the row's coordinates."""
    return random.Random("/".join(map(str, (seed, *parts))))


def random_key(rng: random.Random) -> str:
    """A RULER 'words' key: ``adjective-noun`` (RULER draws these from the wonderwords lists)."""
    return f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"


def random_number(rng: random.Random, digits: int = 7) -> str:
    return str(rng.randint(10 ** (digits - 1), 10 ** digits - 1))


def random_uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))
